#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/cuda_boundary.h"
#include "base/element_type_of.h"
#include "base/torch_boundary.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"
#include "numerics/internal/compare_device.h"
#include "numerics/internal/compare_kernel.h"

namespace lockstep {
namespace numerics {
namespace internal {

absl::StatusOr<bool> MeasureOnDevice(const at::Tensor& actual, const at::Tensor& expected,
                                     const Tolerance& tol, TensorComparison& out) {
  const std::optional<ElementType> type = ElementTypeOf(actual.scalar_type());
  if (!actual.is_cuda() || !type.has_value()) return false;
  ComparePartial total;
  absl::Status launched = absl::OkStatus();
  const absl::Status status = CallTorch("comparing CUDA tensors", [&] {
    c10::cuda::CUDAGuard guard(actual.device());
    const at::Tensor a = actual.contiguous();
    const at::Tensor b = expected.contiguous();
    at::Tensor partials =
        at::empty({static_cast<int64_t>(kComparePartials * sizeof(ComparePartial))},
                  a.options().dtype(at::kByte));
    const cudaError_t error =
        LaunchCompare(a.data_ptr(), b.data_ptr(), a.numel(), *type, tol.atol, tol.rtol,
                      tol.nan_equal, reinterpret_cast<ComparePartial*>(partials.data_ptr()),
                      c10::cuda::getCurrentCUDAStream(actual.device().index()).stream());
    if (error != cudaSuccess) {
      launched = CudaStatus(error, "launching the comparison kernel");
      return;
    }
    const at::Tensor host = partials.cpu();
    const auto* partial = reinterpret_cast<const ComparePartial*>(host.data_ptr());
    for (int i = 0; i < kComparePartials; ++i) MergePartial(total, partial[i]);
  });
  if (!status.ok()) return status;
  if (!launched.ok()) return launched;
  FillComparison(total, tol, actual.sizes(), out);
  return true;
}

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
