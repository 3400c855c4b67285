// planner/plan_digest.cc: a plan's bytes and the digests replicas compare: SerializePlan,
// PlanDigest and the loss weights digest a plan carries (planner.h).

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "base/sha256.h"
#include "base/sha256_message.h"
#include "planner/internal/plan_wire.h"
#include "planner/internal/planner_shared.h"
#include "planner/planner.h"

namespace lockstep {
namespace planner {

// Both write through Note [Plan bytes by hand] (internal/plan_wire.h); protobuf only for a plan
// that carries unknown fields.
std::string SerializePlan(const Plan& plan) {
  const std::optional<internal::PlanWireSizes> sizes = internal::PlanWireSize(plan);
  if (!sizes.has_value()) return SerializeDeterministically(plan);
  std::string bytes;
  bytes.reserve(sizes->total);
  internal::WritePlanWire(plan, *sizes,
                          [&](absl::string_view part) { bytes.append(part.data(), part.size()); });
  return bytes;
}

Sha256Digest PlanDigest(const Plan& plan) {
  Sha256Hasher hasher;
  hasher.AppendFramed(kPlanDigestTag);
  const std::optional<internal::PlanWireSizes> sizes = internal::PlanWireSize(plan);
  if (sizes.has_value()) {
    hasher.AppendLength(sizes->total);
    internal::WritePlanWire(plan, *sizes, [&](absl::string_view part) { hasher.Append(part); });
  } else {
    AppendMessageFramed(hasher, plan);
  }
  return hasher.Finish();
}

namespace internal {

Sha256Digest LossWeightsDigestFrom(absl::Span<const Sequence> batch, int64_t first_weighted) {
  static_assert(std::numeric_limits<float>::is_iec559 && sizeof(float) == 4,
                "loss weights are hashed as IEEE-754 binary32");
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
                "loss weights are hashed as their little-endian in-memory bytes");
  // A batch without per-token weights (the usual case) hashes the tag alone: computed once, not
  // per plan (on cold caches a digest is a visible part of a plan's host time: planner_benchmark).
  if (first_weighted < 0) {
    static const Sha256Digest kUnweighted = Sha256Framed({kLossWeightsDigestTag});
    return kUnweighted;
  }
  Sha256Hasher hasher;
  hasher.AppendFramed(kLossWeightsDigestTag);
  for (size_t i = static_cast<size_t>(first_weighted); i < batch.size(); ++i) {
    const std::vector<float>& weights = batch[i].loss_weights;
    if (weights.empty()) continue;
    hasher.AppendLength(i);
    hasher.AppendLength(weights.size());
    hasher.Append(absl::string_view(reinterpret_cast<const char*>(weights.data()),
                                    weights.size() * sizeof(float)));
  }
  return hasher.Finish();
}

}  // namespace internal

Sha256Digest LossWeightsDigest(absl::Span<const Sequence> batch) {
  const auto weighted = std::find_if(batch.begin(), batch.end(),
                                     [](const Sequence& s) { return !s.loss_weights.empty(); });
  return internal::LossWeightsDigestFrom(
      batch, weighted == batch.end() ? -1 : static_cast<int64_t>(weighted - batch.begin()));
}

}  // namespace planner
}  // namespace lockstep
