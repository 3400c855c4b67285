// admission/admission.h
//
// Memory admission: a plan's microbatches grouped into waves — consecutive microbatches run
// together (one forward over their packed tokens) — each predicted by the memory model to fit
// under a cap. A microbatch that cannot fit even alone is refused before anything runs, naming it,
// its prediction and the cap; nothing is silently dropped or truncated.
//
// Contract:
// - Waves cover the plan's microbatches in order, each exactly once; a wave holds at most
//   `max_microbatches_per_wave`; every wave's prediction (the model applied to the sum of its
//   microbatches' shapes, so the fixed term counts once) is at most the cap. Greedy: a wave is
//   closed when the next microbatch would not fit or the count limit is reached.
// - Deterministic: the same plan, model and cap give the same waves on every replica.
// - Costs O(microbatches x cp_size) plus the shapes' pieces (planner::ShardPieces).
//
// Thread-safety: stateless functions.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(int64_t cap, MemoryCap::FractionOfDevice(0.9).Resolve(probe));
//   LOCKSTEP_ASSIGN_OR_RETURN(Admission admitted, AdmitWaves(plan, model, cap, {}));

#ifndef LOCKSTEP_ADMISSION_ADMISSION_H_
#define LOCKSTEP_ADMISSION_ADMISSION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "admission/memory_model.h"
#include "admission/memory_probe.h"
#include "planner/plan.pb.h"

namespace lockstep {
namespace admission {

// A memory cap: absolute bytes, or a fraction of the device's memory.
class MemoryCap {
 public:
  // A cap of `bytes` bytes (> 0, checked by Resolve).
  static MemoryCap Bytes(int64_t bytes) { return MemoryCap(bytes, 0); }
  // A cap of `fraction` (in (0, 1], checked by Resolve) of the device's total memory, as the
  // probe reports it.
  static MemoryCap FractionOfDevice(double fraction) { return MemoryCap(0, fraction); }

  // The cap in bytes: kInvalidArgument, naming the value, for bytes <= 0 or a fraction outside
  // (0, 1]; the probe's error if it cannot tell the device's memory.
  absl::StatusOr<int64_t> Resolve(MemoryProbe& probe) const;

  // The cap as written for messages: "8.00 GiB", or "0.9 of the device's memory".
  std::string DebugString() const;

 private:
  MemoryCap(int64_t bytes, double fraction) : bytes_(bytes), fraction_(fraction) {}
  int64_t bytes_;
  double fraction_;
};

// How AdmitWaves forms waves.
struct AdmissionOptions {
  // Most microbatches in one wave (>= 1). Default: no limit.
  int max_microbatches_per_wave = 1 << 30;
  // Whether each wave's retained bytes (MemoryModel::PredictRetained: its outputs and what their
  // graph keeps) stay held while the later waves run, as when every microbatch's outputs are
  // handed back at once at the end. A wave's prediction then adds what the waves before it hold,
  // and work whose microbatches fit one by one but not together is refused. Default: off (each
  // wave's outputs are handed back, and released by the caller, before the next runs).
  bool held_until_the_end = false;
};

// Consecutive microbatches of a plan run together, and what the model predicts for them.
struct Wave {
  // Plan indices of the wave's microbatches, consecutive and ascending.
  std::vector<int> microbatches;
  // The sum of the microbatches' shapes (ShapeOfMicrobatch): what the prediction is of.
  WorkShape shape;
  // The model's peak for the wave, plus `held_bytes`.
  double predicted_bytes = 0;
  // What the waves before it keep held (AdmissionOptions::held_until_the_end; else 0).
  double held_bytes = 0;
  // cap - predicted_bytes (>= 0).
  double headroom_bytes = 0;
};

// A plan's microbatches as admitted waves (AdmitWaves).
struct Admission {
  // The cap the waves were formed under, in bytes.
  int64_t cap_bytes = 0;
  // The waves, in plan order, covering every microbatch once.
  std::vector<Wave> waves;
  // The smallest headroom of any wave, in bytes.
  double min_headroom_bytes = 0;
  // The largest prediction of any wave, in bytes.
  double max_predicted_bytes = 0;
};

// Groups `plan`'s microbatches into waves under `cap_bytes`. kInvalidArgument for a plan with no
// microbatches, a non-positive cap or a bad option; kResourceExhausted for a microbatch whose
// prediction alone exceeds the cap ("microbatch 7 (sequences 3, 9; 12000 tokens) is predicted at
// 9.1 GiB alone, above the cap of 8.0 GiB"), or, with held_until_the_end, with what the earlier
// waves hold (naming both amounts).
absl::StatusOr<Admission> AdmitWaves(const planner::Plan& plan, const MemoryModel& model,
                                     int64_t cap_bytes, const AdmissionOptions& options);

// "1.50 GiB" etc., for messages.
std::string FormatBytes(double bytes);

}  // namespace admission
}  // namespace lockstep

#endif  // LOCKSTEP_ADMISSION_ADMISSION_H_
