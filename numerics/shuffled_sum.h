// numerics/shuffled_sum.h
//
// A deliberately nondeterministic operator for negative controls (the reference model's
// nondeterministic-op control, the operator recorder's tests, lockstep.controls from Python),
// registered with LibTorch's dispatcher (TORCH_LIBRARY(lockstep_controls)) so that RecordFunction
// sees it as an operator call, as it sees a real nondeterministic one:
// lockstep_controls::shuffled_sum(Tensor terms) -> Tensor sums a float [k, m] tensor over dim 0
// with float additions in an order drawn from std::random_device on every call (never from
// LibTorch's generators, which the checks compare). With terms that cancel (s and -s, large and
// varied), the rounding residue, and so the output's bits, depend on that order: the same inputs
// give different outputs from call to call.
//
// Thread-safety: stateless.
//
// Example:
//   at::Tensor sum = numerics::controls::ShuffledSum(terms);  // [m]

#ifndef LOCKSTEP_NUMERICS_SHUFFLED_SUM_H_
#define LOCKSTEP_NUMERICS_SHUFFLED_SUM_H_

#include "ATen/core/Tensor.h"

namespace lockstep {
namespace numerics {
namespace controls {

// The operator's name, as the operator recorder and tools/diverge name it.
inline constexpr char kShuffledSumOperator[] = "lockstep_controls::shuffled_sum";

// Calls lockstep_controls::shuffled_sum through the dispatcher. Precondition: `terms` is a CPU
// float tensor of 2 dimensions.
at::Tensor ShuffledSum(const at::Tensor& terms);

// Terms whose sum over dim 0 is exactly 0 but whose float sum depends on the order: 2 * half
// rows, +s_k * values and -s_k * values (float [2 * half, values.numel()]).
at::Tensor CancellingTerms(const at::Tensor& values, int64_t half = 32);

// A residue to add to `output` that makes it nondeterministic (Note [Deliberate nondeterminism]
// in shuffled_sum.cc): about 0, but its bits differ from call to call. On a CUDA tensor through
// index_add_'s floating-point atomics (deterministic algorithms switched off for that operator
// only), on the CPU through lockstep_controls::shuffled_sum. The result has `output`'s shape,
// dtype and device and no autograd history.
at::Tensor RoundingResidue(const at::Tensor& output);

}  // namespace controls
}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_SHUFFLED_SUM_H_
