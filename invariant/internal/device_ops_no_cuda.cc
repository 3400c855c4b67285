#include "absl/status/status.h"
#include "invariant/internal/device_ops.h"

namespace lockstep {
namespace invariant {
namespace internal {
namespace {

absl::Status NoCuda() {
  return absl::UnimplementedError(
      "placement-invariant kernels on CUDA: this lockstep was built without CUDA "
      "(build with --config=cuda)");
}

}  // namespace

absl::StatusOr<at::Tensor> CudaLinearRows(const at::Tensor&, const at::Tensor&) { return NoCuda(); }
absl::StatusOr<at::Tensor> CudaGeluForward(const at::Tensor&) { return NoCuda(); }
absl::StatusOr<at::Tensor> CudaGeluBackward(const at::Tensor&, const at::Tensor&) {
  return NoCuda();
}
absl::StatusOr<at::Tensor> CudaRowLogSumExp(const at::Tensor&) { return NoCuda(); }
absl::StatusOr<at::Tensor> CudaRowSoftmax(const at::Tensor&, const at::Tensor&) { return NoCuda(); }
absl::StatusOr<at::Tensor> CudaAttentionForward(const Visibility&, const at::Tensor&,
                                                const at::Tensor&, const at::Tensor&, double) {
  return NoCuda();
}
absl::StatusOr<AttentionGradients> CudaAttentionBackward(const Visibility&, const at::Tensor&,
                                                         const at::Tensor&, const at::Tensor&,
                                                         const at::Tensor&, double) {
  return NoCuda();
}

}  // namespace internal
}  // namespace invariant
}  // namespace lockstep
