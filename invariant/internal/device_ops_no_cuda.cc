#include "absl/status/status.h"
#include "invariant/internal/device_ops.h"
#include "invariant/internal/no_cuda.h"

namespace lockstep {
namespace invariant {
namespace internal {
namespace {

constexpr char kWhat[] = "placement-invariant kernels";

}  // namespace

absl::StatusOr<at::Tensor> CudaLinearRows(const at::Tensor&, const at::Tensor&) {
  return NoCuda(kWhat);
}
absl::StatusOr<at::Tensor> CudaGeluForward(const at::Tensor&) { return NoCuda(kWhat); }
absl::StatusOr<at::Tensor> CudaGeluBackward(const at::Tensor&, const at::Tensor&) {
  return NoCuda(kWhat);
}
absl::StatusOr<at::Tensor> CudaRowLogSumExp(const at::Tensor&) { return NoCuda(kWhat); }
absl::StatusOr<at::Tensor> CudaRowSoftmax(const at::Tensor&, const at::Tensor&) {
  return NoCuda(kWhat);
}
absl::StatusOr<at::Tensor> CudaAttentionForward(const Visibility&, const at::Tensor&,
                                                const at::Tensor&, const at::Tensor&, double) {
  return NoCuda(kWhat);
}
absl::StatusOr<AttentionGradients> CudaAttentionBackward(const Visibility&, const at::Tensor&,
                                                         const at::Tensor&, const at::Tensor&,
                                                         const at::Tensor&, double) {
  return NoCuda(kWhat);
}

}  // namespace internal
}  // namespace invariant
}  // namespace lockstep
