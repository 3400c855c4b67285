#include <cuda_runtime_api.h>

#include "ATen/ATen.h"
#include "ATen/core/grad_mode.h"
#include "c10/cuda/CUDAException.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"
#include "trainer/internal/device_rows.h"

namespace lockstep {
namespace trainer {
namespace internal {
namespace {

// Up to this many runs; beyond, each copy's few microseconds of host and device time add up past
// ATen's one kernel.
constexpr size_t kMaxRunMemcpys = 8;

}  // namespace

std::optional<at::Tensor> CopyRunsOnDevice(const at::Tensor& rows, const RowRuns& runs) {
  if (runs.size() > kMaxRunMemcpys || !rows.is_cuda() || !rows.is_contiguous() ||
      (at::GradMode::is_enabled() && rows.requires_grad())) {
    return std::nullopt;
  }
  const c10::cuda::CUDAGuard on_device(rows.device());
  std::vector<int64_t> shape = rows.sizes().vec();
  shape[0] = 0;
  for (const auto& run : runs) shape[0] += run.second;
  at::Tensor out = at::empty(shape, rows.options());
  int64_t row_elements = 1;
  for (int64_t d = 1; d < rows.dim(); ++d) row_elements *= rows.size(d);
  const size_t row_bytes = static_cast<size_t>(row_elements) * rows.element_size();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(rows.device().index()).stream();
  const char* from = static_cast<const char*>(rows.data_ptr());
  char* to = static_cast<char*>(out.data_ptr());
  for (const auto& [first, count] : runs) {
    const size_t bytes = static_cast<size_t>(count) * row_bytes;
    if (bytes == 0) continue;
    C10_CUDA_CHECK(cudaMemcpyAsync(to, from + static_cast<size_t>(first) * row_bytes, bytes,
                                   cudaMemcpyDeviceToDevice, stream));
    to += bytes;
  }
  return out;
}

}  // namespace internal
}  // namespace trainer
}  // namespace lockstep
