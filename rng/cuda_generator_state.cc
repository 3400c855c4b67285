// The CUDA half of rng/generator_state.h, linked in by --config=cuda builds: captures and
// restores the default CUDA generator of one device as (seed, Philox offset) values.
//
// Under CUDA graph capture the generator's offset is graph-relative (see Note [CUDA Graph-safe
// RNG states] in LibTorch's CUDAGeneratorImpl.h); capturing or restoring then is refused with
// kFailedPrecondition rather than silently reading a value that replay would not reproduce.

#include <mutex>

#include "ATen/cuda/CUDAGeneratorImpl.h"
#include "absl/strings/str_cat.h"
#include "base/torch_boundary.h"
#include "c10/cuda/CUDAFunctions.h"
#include "c10/cuda/CUDAGraphsC10Utils.h"
#include "rng/generator_state.h"

namespace lockstep {
namespace rng {
namespace {

absl::Status CheckDevice(int device, const char* what) {
  const int count = static_cast<int>(c10::cuda::device_count());
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": CUDA device ", device,
                                                   " does not exist; this process sees ", count,
                                                   " device(s)"));
  }
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " during CUDA graph capture: the generator's offset is graph-relative there"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CudaGeneratorState> Capture(int device) {
  if (absl::Status s = CheckDevice(device, "capturing the CUDA generator"); !s.ok()) return s;
  CudaGeneratorState state;
  state.device = device;
  absl::Status status = CallTorch("capturing the CUDA generator", [&] {
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    auto* impl = gen.get<at::CUDAGeneratorImpl>();
    state.seed = impl->current_seed();
    state.offset = impl->philox_offset_per_thread();
  });
  if (!status.ok()) return status;
  return state;
}

absl::Status Restore(const CudaGeneratorState& state) {
  if (absl::Status s = CheckDevice(state.device, "restoring the CUDA generator"); !s.ok()) {
    return s;
  }
  return CallTorch("restoring the CUDA generator", [&] {
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(state.device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    auto* impl = gen.get<at::CUDAGeneratorImpl>();
    impl->set_current_seed(state.seed);  // also resets the offset
    impl->set_philox_offset_per_thread(state.offset);
  });
}

const bool registered = [] {
  internal::RegisterCudaGeneratorHooks({&Capture, &Restore});
  return true;
}();

}  // namespace
}  // namespace rng
}  // namespace lockstep
