#include "absl/status/status.h"
#include "invariant/internal/device_exact.h"

namespace lockstep {
namespace invariant {
namespace internal {
namespace {

absl::Status NoCuda() {
  return absl::UnimplementedError(
      "exact gradient sums on CUDA: this lockstep was built without CUDA "
      "(build with --config=cuda)");
}

}  // namespace

absl::Status CudaAddOuterProducts(const at::Tensor&, const at::Tensor&, int, at::Tensor&) {
  return NoCuda();
}
absl::Status CudaAddRows(const at::Tensor&, const at::Tensor&, int, at::Tensor&) {
  return NoCuda();
}
absl::Status CudaAddColumns(const at::Tensor&, int, at::Tensor&) { return NoCuda(); }
absl::Status CudaAddWords(const at::Tensor&, at::Tensor&) { return NoCuda(); }
absl::StatusOr<at::Tensor> CudaToLimbs(const at::Tensor&) { return NoCuda(); }
absl::Status CudaFromLimbs(const at::Tensor&, at::Tensor&) { return NoCuda(); }
absl::StatusOr<at::Tensor> CudaToDouble(const at::Tensor&, int) { return NoCuda(); }

}  // namespace internal
}  // namespace invariant
}  // namespace lockstep
