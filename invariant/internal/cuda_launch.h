// invariant/internal/cuda_launch.h
//
// The one shape of the mode's LibTorch wrappers around its CUDA kernels (device_ops_cuda.cc,
// device_exact_cuda.cc): on a tensor's device, under CallTorch (so that the wrapper's own
// allocations raise no exception), queue a kernel on that device's current stream, and turn the
// launch's cudaError_t into a Status naming what was launched.
//
//   at::Tensor out;
//   LOCKSTEP_RETURN_IF_ERROR(LaunchOn("the placement-invariant GELU", x, [&](cudaStream_t s) {
//     out = at::empty_like(x);
//     return LaunchGeluForward(x.data_ptr<double>(), x.numel(), out.data_ptr<double>(), s);
//   }));

#ifndef LOCKSTEP_INVARIANT_INTERNAL_CUDA_LAUNCH_H_
#define LOCKSTEP_INVARIANT_INTERNAL_CUDA_LAUNCH_H_

#include <cuda_runtime_api.h>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/cuda_boundary.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"

namespace lockstep {
namespace invariant {
namespace internal {

// Runs `launch(stream)` (returning the launch's cudaError_t) on `on`'s device and current
// stream; kernel launch failures and LibTorch exceptions both come back naming `what`.
template <typename Launch>
absl::Status LaunchOn(const char* what, const at::Tensor& on, Launch&& launch) {
  cudaError_t error = cudaSuccess;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] {
    c10::cuda::CUDAGuard guard(on.device());
    error = launch(c10::cuda::getCurrentCUDAStream(on.device().index()).stream());
  }));
  return CudaStatus(error, absl::StrCat("launching ", what));
}

}  // namespace internal
}  // namespace invariant
}  // namespace lockstep

#endif  // LOCKSTEP_INVARIANT_INTERNAL_CUDA_LAUNCH_H_
