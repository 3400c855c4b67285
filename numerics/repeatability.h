// numerics/repeatability.h
//
// The repeatability harness: runs a step (forward and backward of the caller's model on a fixed
// batch, no optimizer update) three times — cold, warm1, warm2 — from the same RNG state and
// with the gradients cleared, and compares outputs and gradients pass to pass under a tolerance
// (warm1 against cold, warm2 against warm1). A first pass that differs from the warm ones shows
// state that warms up (autotuning, caches, lazily allocated buffers); warm passes that differ
// show nondeterminism (atomics, unordered reductions, thread counts).
//
// Before each pass the harness restores the default CPU generator and the default CUDA
// generator of every device the parameters live on to their state before the cold pass, and
// resets every parameter's gradient; the step must not depend on other state that changes
// between passes (that is what the harness is there to reveal).
//
// Thread-safety: runs the step on the calling thread.
//
// Example:
//   auto step = [&]() -> absl::StatusOr<numerics::NamedTensors> {
//     at::Tensor loss = model->forward(batch).mean();
//     loss.backward();
//     return numerics::NamedTensors{{"loss", loss}};
//   };
//   LOCKSTEP_ASSIGN_OR_RETURN(numerics::RepeatabilityReport report,
//       numerics::RunRepeatability(step, named_parameters, numerics::Tolerance::Bitwise()));

#ifndef LOCKSTEP_NUMERICS_REPEATABILITY_H_
#define LOCKSTEP_NUMERICS_REPEATABILITY_H_

#include <functional>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"
#include "numerics/compare.h"
#include "numerics/named_tensors.h"

namespace lockstep {
namespace numerics {

// One pass: forward + backward; returns the outputs to compare.
using StepFunction = std::function<absl::StatusOr<NamedTensors>()>;

// What RunRepeatability found: the passes compared pairwise (see the top of this file).
struct RepeatabilityReport {
  // warm1 (actual) against cold (expected). Outputs as "output/<name>", gradients as
  // "grad/<parameter name>"; a difference here alone shows state that warms up.
  SetComparison warm1_vs_cold;
  // warm2 (actual) against warm1 (expected), named as above; a difference shows nondeterminism.
  SetComparison warm2_vs_warm1;
  // Whether both comparisons passed: every output and gradient within the tolerance, pass to
  // pass.
  bool repeatable() const { return warm1_vs_cold.all_passed() && warm2_vs_warm1.all_passed(); }
};

// Runs the three passes. Errors: the step's own, or LibTorch's (with context).
absl::StatusOr<RepeatabilityReport> RunRepeatability(const StepFunction& step,
                                                     const NamedTensors& parameters,
                                                     const Tolerance& tolerance);

// {"repeatable", "warm1_vs_cold": set comparison, "warm2_vs_warm1": set comparison}.
nlohmann::json RepeatabilityJson(const RepeatabilityReport& report);

}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_REPEATABILITY_H_
