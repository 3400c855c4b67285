// invariant/internal/cuda_kernels.h
//
// The CUDA kernels of invariant/ops.h, over float64 device buffers (contiguous, row-major),
// launched on `stream`. Each output element is computed by the float64 operations that
// cpu_kernels.cc writes for it, in the same order, through explicitly rounded intrinsics (never
// contracted into a fused multiply-add), so that its bits do not depend on the launch's shape or
// on the element's position. Plain C++ interface, so nvcc never parses LibTorch.

#ifndef LOCKSTEP_INVARIANT_INTERNAL_CUDA_KERNELS_H_
#define LOCKSTEP_INVARIANT_INTERNAL_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lockstep {
namespace invariant {
namespace internal {

// out[m, n] = sum over k in increasing order of x[m, k] * w_t[k, n].
cudaError_t LaunchLinearRows(const double* x, const double* w_t, int64_t m, int64_t k, int64_t n,
                             double* out, cudaStream_t stream);

// GELU (erf form) of `count` elements; its derivative times dy.
cudaError_t LaunchGeluForward(const double* x, int64_t count, double* out, cudaStream_t stream);
cudaError_t LaunchGeluBackward(const double* x, const double* dy, int64_t count, double* out,
                               cudaStream_t stream);

// Each of `m` rows' log-sum-exp (cpu_kernels.h's RowLogSumExp) of z [m, v]; each row's softmax
// given it, exp(z - lse), elementwise.
cudaError_t LaunchRowLogSumExp(const double* z, int64_t m, int64_t v, double* lse,
                               cudaStream_t stream);
cudaError_t LaunchRowSoftmax(const double* z, const double* lse, int64_t m, int64_t v, double* out,
                             cudaStream_t stream);

// Which keys each query sees (cpu_kernels.h's Visibility, flattened into device arrays):
// key_rows holds every sequence's key rows in increasing position, sequence after sequence;
// query i sees key_rows[query_first[i], query_first[i] + query_count[i]) and owns
// scratch[scratch_start[i], scratch_start[i] + query_count[i]) of each scratch buffer. Key g
// (an index into key_rows) is its sequence's key_index[g]-th; that sequence's queries, in
// increasing position, are sequence_queries[key_queries_first[g], key_queries_end[g]).
struct DeviceVisibility {
  const int64_t* key_rows;
  const int64_t* query_first;
  const int64_t* query_count;
  const int64_t* scratch_start;
  const int64_t* key_index;
  const int64_t* key_queries_first;
  const int64_t* key_queries_end;
  const int64_t* sequence_queries;
  int64_t queries;
  int64_t keys;
};

// Attention's output [queries, dv] from q [queries, d], k and v [rows, d] / [rows, dv];
// `scratch` holds scratch_start[queries] doubles.
cudaError_t LaunchAttentionForward(const DeviceVisibility& visible, const double* q,
                                   const double* k, const double* v, int64_t d, int64_t dv,
                                   double scale, double* scratch, double* out, cudaStream_t stream);

// Its gradients: dq [queries, d], dk [rows, d], dv_out [rows, dv], all zero-filled by the
// caller; `probabilities` and `score_grads` each hold scratch_start[queries] doubles.
cudaError_t LaunchAttentionBackward(const DeviceVisibility& visible, const double* q,
                                    const double* k, const double* v, const double* dout, int64_t d,
                                    int64_t dv, double scale, double* probabilities,
                                    double* score_grads, double* dq, double* dk, double* dv_out,
                                    cudaStream_t stream);

}  // namespace internal
}  // namespace invariant
}  // namespace lockstep

#endif  // LOCKSTEP_INVARIANT_INTERNAL_CUDA_KERNELS_H_
