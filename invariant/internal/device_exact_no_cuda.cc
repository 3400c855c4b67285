#include "absl/status/status.h"
#include "invariant/internal/device_exact.h"
#include "invariant/internal/no_cuda.h"

namespace lockstep {
namespace invariant {
namespace internal {
namespace {

constexpr char kWhat[] = "exact gradient sums";

}  // namespace

absl::Status CudaAddOuterProducts(const at::Tensor&, const at::Tensor&, int, at::Tensor&) {
  return NoCuda(kWhat);
}
absl::Status CudaAddRows(const at::Tensor&, const at::Tensor&, int, at::Tensor&) {
  return NoCuda(kWhat);
}
absl::Status CudaAddColumns(const at::Tensor&, int, at::Tensor&) { return NoCuda(kWhat); }
absl::Status CudaAddWords(const at::Tensor&, at::Tensor&) { return NoCuda(kWhat); }
absl::StatusOr<at::Tensor> CudaToLimbs(const at::Tensor&) { return NoCuda(kWhat); }
absl::Status CudaFromLimbs(const at::Tensor&, at::Tensor&) { return NoCuda(kWhat); }
absl::StatusOr<at::Tensor> CudaToDouble(const at::Tensor&, int) { return NoCuda(kWhat); }

}  // namespace internal
}  // namespace invariant
}  // namespace lockstep
