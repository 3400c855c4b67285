// invariant/internal/cpu_kernels.h
//
// The float64 loops behind invariant/ops.h (Note [Placement invariance] there): every argument
// and result is a contiguous float64 CPU tensor, shapes already checked. Compiled without
// floating-point contraction, so that an element's operations are the ones written whichever
// path (vectorized or not) the compiler gives its position.

#ifndef LOCKSTEP_INVARIANT_INTERNAL_CPU_KERNELS_H_
#define LOCKSTEP_INVARIANT_INTERNAL_CPU_KERNELS_H_

#include <cstdint>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"

namespace lockstep {
namespace invariant {
namespace internal {

// out [M, N], out[m, n] = sum over k in increasing order of x[m, k] * w_t[k, n]; x [M, K],
// w_t [K, N] (a linear layer's weight, transposed).
at::Tensor LinearRows(const at::Tensor& x, const at::Tensor& w_t);

// GELU (erf form) and its derivative times dy, elementwise.
at::Tensor GeluForward(const at::Tensor& x);
at::Tensor GeluBackward(const at::Tensor& x, const at::Tensor& dy);

// Each row's log-sum-exp, [M] from z [M, V]: the row's maximum plus the log of the sum, in
// increasing v, of exp(z[m, v] - maximum).
at::Tensor RowLogSumExp(const at::Tensor& z);

// Each row's softmax given its log-sum-exp: exp(z[m, v] - lse[m]), elementwise.
at::Tensor RowSoftmax(const at::Tensor& z, const at::Tensor& lse);

// Which keys each query sees, in increasing position: built once per call from the tokens
// (int64 [M, 2] CPU).
struct Visibility {
  // The keys of each sequence, sorted by position: their rows.
  std::vector<std::vector<int64_t>> sequence_keys;
  // Query i sees sequence_keys[sequence[i]][0, count[i]).
  std::vector<int64_t> sequence;
  std::vector<int64_t> count;
  // The queries of each sequence, sorted by position (dk and dv sum over them in this order).
  std::vector<std::vector<int64_t>> sequence_queries;
};
absl::StatusOr<Visibility> SeeKeys(const at::Tensor& query_tokens, const at::Tensor& key_tokens);

// Attention's output [Mq, Dv] from q [Mq, D], k [Mk, D], v [Mk, Dv].
at::Tensor AttentionForward(const Visibility& visible, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, double scale);

struct AttentionGradients {
  at::Tensor dq, dk, dv;
};
AttentionGradients AttentionBackward(const Visibility& visible, const at::Tensor& q,
                                     const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& dout, double scale);

}  // namespace internal
}  // namespace invariant
}  // namespace lockstep

#endif  // LOCKSTEP_INVARIANT_INTERNAL_CPU_KERNELS_H_
