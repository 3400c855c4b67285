#include "admission/admission.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace lockstep {
namespace admission {

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (std::abs(bytes) >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", bytes, units[unit]);
}

absl::StatusOr<int64_t> MemoryCap::Resolve(MemoryProbe& probe) const {
  if (fraction_ == 0) {
    if (bytes_ <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("memory cap of ", bytes_, " bytes: must be positive"));
    }
    return bytes_;
  }
  if (!(fraction_ > 0 && fraction_ <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory cap fraction ", fraction_, " of the device: must be in (0, 1]"));
  }
  absl::StatusOr<int64_t> total = probe.DeviceTotalBytes();
  if (!total.ok()) return total.status();
  return static_cast<int64_t>(std::floor(fraction_ * static_cast<double>(*total)));
}

std::string MemoryCap::DebugString() const {
  if (fraction_ == 0) return FormatBytes(static_cast<double>(bytes_));
  return absl::StrCat(fraction_, " of the device's memory");
}

absl::StatusOr<Admission> AdmitWaves(const planner::Plan& plan, const MemoryModel& model,
                                     int64_t cap_bytes, const AdmissionOptions& options) {
  if (plan.microbatches_size() == 0) {
    return absl::InvalidArgumentError("admission: the plan has no microbatches");
  }
  if (cap_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("admission: cap of ", cap_bytes, " bytes must be positive"));
  }
  if (options.max_microbatches_per_wave < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("admission: max_microbatches_per_wave = ", options.max_microbatches_per_wave,
                     " must be at least 1"));
  }
  const double cap = static_cast<double>(cap_bytes);
  Admission admission;
  admission.cap_bytes = cap_bytes;
  // Bytes the waves closed so far keep held (only when they are held until the end).
  double held = 0;
  Wave current;
  auto close = [&] {
    current.held_bytes = held;
    current.predicted_bytes = held + model.Predict(current.shape);
    current.headroom_bytes = cap - current.predicted_bytes;
    if (options.held_until_the_end) held += model.PredictRetained(current.shape);
    admission.waves.push_back(std::move(current));
    current = Wave();
  };
  for (int m = 0; m < plan.microbatches_size(); ++m) {
    const WorkShape shape = ShapeOfMicrobatch(plan, m);
    const double alone = model.Predict(shape);
    const planner::Microbatch& mb = plan.microbatches(m);
    const std::string which =
        absl::StrCat("microbatch ", m, " (sequences ", absl::StrJoin(mb.sequence_id(), ", "), "; ",
                     mb.num_tokens(), " tokens, ", shape.tokens, " on the busiest CP rank)");
    if (alone > cap) {
      return absl::ResourceExhaustedError(
          absl::StrCat("admission: ", which, " is predicted at ", FormatBytes(alone),
                       " alone, above the cap of ", FormatBytes(cap),
                       "; it cannot be admitted (lower the token budget or raise the cap)"));
    }
    if (!current.microbatches.empty() &&
        (static_cast<int>(current.microbatches.size()) >= options.max_microbatches_per_wave ||
         held + model.Predict(current.shape + shape) > cap)) {
      close();
    }
    if (held + alone > cap) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "admission: ", which, " is predicted at ", FormatBytes(alone), " on top of ",
          FormatBytes(held), " that the microbatches before it keep held until the hand-back, ",
          FormatBytes(held + alone), " in all, above the cap of ", FormatBytes(cap),
          "; each fits alone but not all together: hand them back one at a time (the "
          "microbatch stream) or raise the cap"));
    }
    current.microbatches.push_back(m);
    current.shape = current.shape + shape;
  }
  close();
  admission.min_headroom_bytes = cap;
  for (const Wave& wave : admission.waves) {
    admission.min_headroom_bytes = std::min(admission.min_headroom_bytes, wave.headroom_bytes);
    admission.max_predicted_bytes = std::max(admission.max_predicted_bytes, wave.predicted_bytes);
  }
  return admission;
}

}  // namespace admission
}  // namespace lockstep
