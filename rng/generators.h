// rng/generators.h
//
// Which default generators make up a rank's RNG state, and the value types that describe a CUDA
// generator's position. A rank's default generators are the process's default CPU generator and,
// when the rank has a CUDA device, that device's default CUDA generator (only that device: other
// devices are out of scope). CUDA support is linked in by --config=cuda builds
// (rng/cuda_generator_state.cc registers it); elsewhere asking for a CUDA device is
// kFailedPrecondition wherever a generator is read or written.
//
// Under CUDA graph capture a CUDA generator's position is graph-relative (see snapshot.h):
// CudaGeneratorState then holds a CudaCapturePosition instead of (seed, offset).
//
// Thread-safety: values; freely copyable.
//
// Example:
//   const rng::DefaultGenerators gens = rng::DefaultGenerators::WithCudaDevice(local_rank);

#ifndef LOCKSTEP_RNG_GENERATORS_H_
#define LOCKSTEP_RNG_GENERATORS_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lockstep {
namespace rng {

// The generators that make up a rank's default RNG state.
struct DefaultGenerators {
  // The rank's own CUDA device, or -1 for a CPU-only rank. Default: -1.
  int cuda_device = -1;

  // The CPU generator only.
  static DefaultGenerators CpuOnly() { return DefaultGenerators(); }
  // The CPU generator and the CUDA generator of `device` (>= 0).
  static DefaultGenerators WithCudaDevice(int device) {
    DefaultGenerators generators;
    generators.cuda_device = device;
    return generators;
  }

  // Whether a CUDA generator is among them.
  bool has_cuda() const { return cuda_device >= 0; }
  // Whether both name the same generators.
  bool operator==(const DefaultGenerators& o) const { return cuda_device == o.cuda_device; }
  // Whether they name different generators.
  bool operator!=(const DefaultGenerators& o) const { return !(*this == o); }
};

namespace internal {
// The graph-safe generator state live when an in-capture snapshot was taken (opaque; defined in
// rng/cuda_generator_state.cc).
struct GraphSafeCudaState;
}  // namespace internal

// Position of a CUDA generator inside a graph being captured.
struct CudaCapturePosition {
  // cudaStreamGetCaptureInfo's id of the capture the snapshot was taken in.
  uint64_t capture_id = 0;
  // Philox offset relative to the start of the captured graph.
  uint64_t offset_intragraph = 0;
  // The generator state object that was live (shared, never written through); null where the
  // LibTorch build has no graph-safe generator state.
  std::shared_ptr<const internal::GraphSafeCudaState> live;

  // Whether both are the same position of the same capture (`live` is not compared).
  bool operator==(const CudaCapturePosition& o) const {
    return capture_id == o.capture_id && offset_intragraph == o.offset_intragraph;
  }
};

// State of one CUDA generator: Philox seed and offset, or, when taken during CUDA graph capture,
// its graph-relative position (then `seed` and `offset` are 0: they are only known at replay).
// Built through Eager() or InCapture(), never field by field.
struct CudaGeneratorState {
  // The CUDA device whose default generator this is.
  int device = 0;
  // The Philox seed (0 in capture).
  uint64_t seed = 0;
  // The Philox offset: how far the generator has advanced its counter (0 in capture).
  uint64_t offset = 0;
  // The graph-relative position when taken during CUDA graph capture; absent otherwise.
  std::optional<CudaCapturePosition> in_capture;

  // The state of `device`'s generator outside capture: Philox `seed` and `offset`.
  static CudaGeneratorState Eager(int device, uint64_t seed, uint64_t offset) {
    CudaGeneratorState state;
    state.device = device;
    state.seed = seed;
    state.offset = offset;
    return state;
  }
  // The state of `device`'s generator at `position` in a graph being captured.
  static CudaGeneratorState InCapture(int device, CudaCapturePosition position) {
    CudaGeneratorState state;
    state.device = device;
    state.in_capture = std::move(position);
    return state;
  }

  // Whether restoring this state can rewind the generator: always outside capture; inside, only
  // where graph-safe generator state is available (otherwise the in-capture state only records
  // the position, and restoring it succeeds only if nothing has drawn since).
  bool rewindable() const { return !in_capture.has_value() || in_capture->live != nullptr; }

  // Whether every field is equal (positions compared as CudaCapturePosition's == does).
  bool operator==(const CudaGeneratorState& o) const {
    return device == o.device && seed == o.seed && offset == o.offset && in_capture == o.in_capture;
  }
};

// Hooks through which a CUDA-enabled build provides the CUDA half (rng/cuda_generator_state.cc
// registers them at load time). Not for callers.
namespace internal {
struct CudaGeneratorHooks {
  absl::StatusOr<CudaGeneratorState> (*capture)(int device) = nullptr;
  absl::Status (*restore)(const CudaGeneratorState& state) = nullptr;
  // Whether this LibTorch has graph-safe generator state (graphsafe_get_state/set_state).
  bool graph_safe_supported = false;
};
void RegisterCudaGeneratorHooks(const CudaGeneratorHooks& hooks);
// The registered hooks, or null in builds without CUDA.
const CudaGeneratorHooks* CudaHooks();

// kFailedPrecondition, naming `device`, when this build has no CUDA support.
absl::Status RequireCudaSupport(int device);

// Pretends (false) that this LibTorch lacks graph-safe generator state, for tests of the refusal
// path: in-capture snapshots then record only the intragraph offset, and restoring one is refused
// unless the generator has not moved since (no stochastic op ran). Default: true where the
// LibTorch build has the API (2.4 and later).
void SetGraphSafeCudaStateEnabledForTesting(bool enabled);
bool GraphSafeCudaStateAvailable();

// Whether the CUDA half is linked in (a --config=cuda build).
bool CudaGeneratorsLinked();
}  // namespace internal

}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_GENERATORS_H_
