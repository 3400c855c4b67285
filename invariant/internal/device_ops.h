// invariant/internal/device_ops.h
//
// The CUDA half of invariant/ops.h's kernels (cuda_kernels.h), over float64 contiguous CUDA
// tensors, on the current stream of their device: the same functions as cpu_kernels.h, each
// element computed by the same operations in the same order. In a build without CUDA each
// returns kUnimplemented.

#ifndef LOCKSTEP_INVARIANT_INTERNAL_DEVICE_OPS_H_
#define LOCKSTEP_INVARIANT_INTERNAL_DEVICE_OPS_H_

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "invariant/internal/cpu_kernels.h"

namespace lockstep {
namespace invariant {
namespace internal {

absl::StatusOr<at::Tensor> CudaLinearRows(const at::Tensor& x, const at::Tensor& w_t);
absl::StatusOr<at::Tensor> CudaGeluForward(const at::Tensor& x);
absl::StatusOr<at::Tensor> CudaGeluBackward(const at::Tensor& x, const at::Tensor& dy);
absl::StatusOr<at::Tensor> CudaRowLogSumExp(const at::Tensor& z);
absl::StatusOr<at::Tensor> CudaRowSoftmax(const at::Tensor& z, const at::Tensor& lse);
absl::StatusOr<at::Tensor> CudaAttentionForward(const Visibility& visible, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& v,
                                                double scale);
absl::StatusOr<AttentionGradients> CudaAttentionBackward(const Visibility& visible,
                                                         const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& v,
                                                         const at::Tensor& dout, double scale);

}  // namespace internal
}  // namespace invariant
}  // namespace lockstep

#endif  // LOCKSTEP_INVARIANT_INTERNAL_DEVICE_OPS_H_
