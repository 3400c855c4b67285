// The CUDA half of rng/snapshot.h, linked in by --config=cuda builds: captures and
// restores the default CUDA generator of one device as (seed, Philox offset) values, and during
// CUDA graph capture as a graph-relative position.
//
// Under capture (see Note [CUDA Graph-safe RNG states] in LibTorch's CUDAGeneratorImpl.h) kernels
// take their seed and base offset from two device words that every replay fills, plus an
// intragraph offset that the generator's state object hands out and advances. LibTorch exposes
// that object only through graphsafe_get_state() (an alias) and graphsafe_set_state() (installs
// an object). So an in-capture snapshot keeps the intragraph offset as a value, and its restore
// installs either the very object that was live (when that object still sits at the recorded
// offset: the usual "put the live state back" case) or a new capture-only object positioned at
// the recorded offset and pointing at the same device words (the "rewind for recompute" case).
// The graph's registered object is never written, so the graph's whole-graph offset increment,
// and with it every later eager draw, is unaffected by a rewind.

#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>
#include <mutex>

#include "ATen/cuda/CUDAGeneratorImpl.h"
#include "ATen/ops/from_blob.h"
#include "absl/strings/str_cat.h"
#include "base/cuda_boundary.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "c10/cuda/CUDAFunctions.h"
#include "c10/cuda/CUDAStream.h"
#include "rng/generators.h"
#include "torch/version.h"

// graphsafe_get_state/graphsafe_set_state and the shared CUDAGeneratorState appeared in 2.4.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define LOCKSTEP_HAS_GRAPHSAFE_CUDA_STATE 1
#else
#define LOCKSTEP_HAS_GRAPHSAFE_CUDA_STATE 0
#endif

namespace lockstep {
namespace rng {
namespace internal {

struct GraphSafeCudaState {
#if LOCKSTEP_HAS_GRAPHSAFE_CUDA_STATE
  // Alias of the state object that was live; used to read its current offset and to reinstall
  // it, never to write it.
  c10::intrusive_ptr<c10::GeneratorImpl> handle;
#endif
  // The device words the captured kernels read their seed and base offset from.
  int64_t* seed_word = nullptr;
  int64_t* offset_word = nullptr;
};

}  // namespace internal

namespace {

absl::Status CheckDevice(int device, const char* what) {
  const int count = static_cast<int>(c10::cuda::device_count());
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": CUDA device ", device,
                                                   " does not exist; this process sees ", count,
                                                   " device(s)"));
  }
  return absl::OkStatus();
}

// Whether the current stream of `device` is capturing a graph, and the capture's id.
absl::StatusOr<std::optional<uint64_t>> CurrentCaptureId(int device, const char* what) {
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;  // NOLINT(runtime/int): the CUDA API's type
  if (cudaError_t err = cudaStreamGetCaptureInfo(stream, &status, &id); err != cudaSuccess) {
    return CudaStatus(err, absl::StrCat(what, ": cudaStreamGetCaptureInfo"));
  }
  switch (status) {
    case cudaStreamCaptureStatusNone:
      return std::optional<uint64_t>();
    case cudaStreamCaptureStatusActive:
      return std::optional<uint64_t>(id);
    default:
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": the CUDA graph capture on device ", device, " was invalidated"));
  }
}

// Whether RestoreInCapture ever installed a capture-only position in this process: only such a
// position can be left behind, so until then the check below (two graph-capture queries to the
// CUDA runtime, on every capture and restore of a model-stream scope) is skipped.
std::atomic<bool> capture_position_installed{false};

// Whether the installed state is a capture-only position left behind after its capture ended
// (a restore during capture not followed by restoring the live state). Eagerly, a zero
// increment is a no-op on a normal state and refused by a capturing one. Call under the
// generator's lock, outside capture.
bool HoldsLeftoverCapturePosition(at::CUDAGeneratorImpl* impl) {
  if (!capture_position_installed.load(std::memory_order_acquire)) return false;
  try {
    (void)impl->philox_cuda_state(0);
    return false;
  } catch (const c10::Error&) {
    return true;
  }
}

absl::Status LeftoverError(int device, const char* what) {
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": the CUDA generator of device ", device, " still holds a position rewound during a ",
      "CUDA graph capture that has ended (a restore during capture was not followed by ",
      "restoring a later snapshot); its draws would fail or repeat the graph's"));
}

absl::StatusOr<CudaGeneratorState> Capture(int device) {
  constexpr char kWhat[] = "capturing the CUDA generator";
  if (absl::Status s = CheckDevice(device, kWhat); !s.ok()) return s;
  absl::StatusOr<std::optional<uint64_t>> capture = CurrentCaptureId(device, kWhat);
  if (!capture.ok()) return capture.status();
  CudaGeneratorState state = CudaGeneratorState::Eager(device, 0, 0);
  bool leftover = false;
  absl::Status status = CallTorch(kWhat, [&] {
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    auto* impl = gen.get<at::CUDAGeneratorImpl>();
    if (!capture->has_value()) {
      if ((leftover = HoldsLeftoverCapturePosition(impl))) return;
      state =
          CudaGeneratorState::Eager(device, impl->current_seed(), impl->philox_offset_per_thread());
      return;
    }
    // An increment of 0 reads the intragraph offset without moving it (and checks that the
    // generator takes part in this capture).
    const at::PhiloxCudaState position = impl->philox_cuda_state(0);
    CudaCapturePosition in_capture;
    in_capture.capture_id = **capture;
    in_capture.offset_intragraph = position.offset_intragraph_;
    if (internal::GraphSafeCudaStateAvailable()) {
      auto live = std::make_shared<internal::GraphSafeCudaState>();
#if LOCKSTEP_HAS_GRAPHSAFE_CUDA_STATE
      live->handle = impl->graphsafe_get_state();
#endif
      live->seed_word = position.seed_.ptr;
      live->offset_word = position.offset_.ptr;
      in_capture.live = std::move(live);
    }
    state = CudaGeneratorState::InCapture(device, std::move(in_capture));
  });
  if (!status.ok()) return status;
  if (leftover) return LeftoverError(device, kWhat);
  return state;
}

absl::Status RestoreInCapture(const CudaGeneratorState& state, uint64_t current_capture) {
  const CudaCapturePosition& saved = *state.in_capture;
  if (saved.capture_id != current_capture) {
    return absl::FailedPreconditionError(absl::StrCat(
        "restoring the CUDA generator of device ", state.device, ": the state was taken in CUDA ",
        "graph capture ", saved.capture_id, ", but capture ", current_capture,
        " is underway; graph-relative positions do not carry between captures"));
  }
  uint64_t moved_to = saved.offset_intragraph;
  absl::Status status = CallTorch("restoring the CUDA generator during graph capture", [&] {
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(state.device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    auto* impl = gen.get<at::CUDAGeneratorImpl>();
    if (saved.live == nullptr) {
      // No graph-safe state to rewind: fine as long as nothing has drawn since the snapshot.
      moved_to = impl->philox_cuda_state(0).offset_intragraph_;
      return;
    }
#if LOCKSTEP_HAS_GRAPHSAFE_CUDA_STATE
    auto* original = static_cast<at::CUDAGeneratorImpl*>(saved.live->handle.get());
    if (original->philox_cuda_state(0).offset_intragraph_ == saved.offset_intragraph) {
      impl->graphsafe_set_state(saved.live->handle);
      return;
    }
    const at::TensorOptions word = at::TensorOptions().dtype(at::kLong).device(
        at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(state.device)));
    auto positioned = c10::make_intrusive<at::CUDAGeneratorState>(0, 0, saved.offset_intragraph);
    positioned->capturing_ = true;
    capture_position_installed.store(true, std::memory_order_release);
    // target_device() skips the pointer-attribute query, which capture forbids.
    positioned->seed_extragraph_ = at::for_blob(saved.live->seed_word, {1})
                                       .options(word)
                                       .target_device(word.device())
                                       .make_tensor();
    positioned->offset_extragraph_ = at::for_blob(saved.live->offset_word, {1})
                                         .options(word)
                                         .target_device(word.device())
                                         .make_tensor();
    impl->graphsafe_set_state(c10::make_intrusive<at::CUDAGeneratorImpl>(
        static_cast<c10::DeviceIndex>(state.device), std::move(positioned)));
#endif
  });
  if (!status.ok()) return status;
  if (moved_to != saved.offset_intragraph) {
    return absl::FailedPreconditionError(absl::StrCat(
        "restoring the CUDA generator of device ", state.device, " during graph capture: ",
        "stochastic CUDA ops ran since the snapshot (intragraph offset ", saved.offset_intragraph,
        " -> ", moved_to, "), and this LibTorch build has no graph-safe generator state ",
        "(graphsafe_get_state/graphsafe_set_state) to replay them; run them eagerly or use ",
        "LibTorch 2.4 or later"));
  }
  return absl::OkStatus();
}

absl::Status Restore(const CudaGeneratorState& state) {
  constexpr char kWhat[] = "restoring the CUDA generator";
  if (absl::Status s = CheckDevice(state.device, kWhat); !s.ok()) return s;
  absl::StatusOr<std::optional<uint64_t>> capture = CurrentCaptureId(state.device, kWhat);
  if (!capture.ok()) return capture.status();
  if (state.in_capture.has_value()) {
    if (!capture->has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          kWhat, " of device ", state.device, ": the state was taken during CUDA graph capture ",
          state.in_capture->capture_id, " and is graph-relative; it cannot be restored after ",
          "that capture ended"));
    }
    return RestoreInCapture(state, **capture);
  }
  if (capture->has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        kWhat, " of device ", state.device, ": the state (seed ", state.seed, ", offset ",
        state.offset, ") was taken outside CUDA graph capture and cannot be installed while ",
        "capture ", **capture, " is underway (the graph's offsets are graph-relative)"));
  }
  bool leftover = false;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(kWhat, [&] {
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(state.device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    auto* impl = gen.get<at::CUDAGeneratorImpl>();
    // Writing into a leftover capture-only state would not make it usable again.
    if ((leftover = HoldsLeftoverCapturePosition(impl))) return;
    impl->set_current_seed(state.seed);  // also resets the offset
    impl->set_philox_offset_per_thread(state.offset);
  }));
  if (leftover) return LeftoverError(state.device, kWhat);
  return absl::OkStatus();
}

const bool registered = [] {
  internal::CudaGeneratorHooks hooks;
  hooks.capture = &Capture;
  hooks.restore = &Restore;
  hooks.graph_safe_supported = LOCKSTEP_HAS_GRAPHSAFE_CUDA_STATE;
  internal::RegisterCudaGeneratorHooks(hooks);
  return true;
}();

}  // namespace
}  // namespace rng
}  // namespace lockstep
