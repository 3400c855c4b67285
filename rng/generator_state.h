// rng/generator_state.h
//
// RngSnapshot is a value copy of the rank's default generators: the process's default CPU
// generator (its full state) and, when the rank has a CUDA device, that device's default CUDA
// generator (seed and Philox offset). Snapshots are values, never aliases: capturing copies the
// bytes out, so a snapshot does not change when the live generators advance afterwards, and
// restoring copies them back in.
//
// Which generators belong to the rank is a DefaultGenerators value: the CPU generator always,
// plus the CUDA generator of `cuda_device` only (other devices are out of scope). CUDA support
// is linked in by --config=cuda builds; elsewhere asking for a CUDA device is kFailedPrecondition.
//
// Under CUDA graph capture on the rank's current stream, the CUDA generator's position is
// graph-relative: kernels read the seed and base offset from device memory that each replay
// fills, plus an intragraph offset fixed at capture time. A snapshot taken during capture
// records that intragraph offset (CudaGeneratorState::in_capture) and its restore, in the same
// capture, makes the following captured kernels draw from that position again, so replay
// reproduces the draws of the captured region exactly (what activation-checkpoint recompute
// inside a graph needs). Restoring an in-capture snapshot outside its capture, or an eager one
// during a capture, is refused (kFailedPrecondition). A restore during capture must be followed,
// before the capture ends, by restoring a snapshot taken after it (as scopes and checkpoints
// do) so that the graph's own generator state is live again; a rewound position left installed
// past the end of the capture makes every later CUDA draw on that device fail, and Capture and
// Restore then refuse with kFailedPrecondition saying so. Restore writes both generators or
// neither.
//
// Out of scope (not captured, not restored): Python and NumPy generators, generators passed
// explicitly to operators, CUDA generators of other devices, and concurrent users of the
// default generators (they are process-global; one thread at a time).
//
// Example:
//   DefaultGenerators gens{.cuda_device = local_rank};
//   LOCKSTEP_ASSIGN_OR_RETURN(RngSnapshot before, RngSnapshot::Capture(gens));
//   RunSomethingRandom();
//   LOCKSTEP_RETURN_IF_ERROR(before.Restore());  // the draws above never happened

#ifndef LOCKSTEP_RNG_GENERATOR_STATE_H_
#define LOCKSTEP_RNG_GENERATOR_STATE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lockstep {
namespace rng {

// The generators that make up a rank's default RNG state.
struct DefaultGenerators {
  // The rank's own CUDA device, or -1 for a CPU-only rank. Default: -1.
  int cuda_device = -1;

  bool has_cuda() const { return cuda_device >= 0; }
  bool operator==(const DefaultGenerators& o) const { return cuda_device == o.cuda_device; }
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
  // The generator state object that was live (shared, never written through).
  std::shared_ptr<const internal::GraphSafeCudaState> live;

  bool operator==(const CudaCapturePosition& o) const {
    return capture_id == o.capture_id && offset_intragraph == o.offset_intragraph;
  }
};

// State of one CUDA generator: Philox seed and offset, or, when taken during CUDA graph capture,
// its graph-relative position (then `seed` and `offset` are 0: they are only known at replay).
struct CudaGeneratorState {
  int device = 0;
  uint64_t seed = 0;
  uint64_t offset = 0;
  std::optional<CudaCapturePosition> in_capture;

  // Whether restoring this state can rewind the generator: always outside capture; inside, only
  // where graph-safe generator state is available (otherwise the in-capture state only records
  // the position, and restoring it succeeds only if nothing has drawn since).
  bool rewindable() const { return !in_capture.has_value() || in_capture->live != nullptr; }

  bool operator==(const CudaGeneratorState& o) const {
    return device == o.device && seed == o.seed && offset == o.offset && in_capture == o.in_capture;
  }
};

class RngSnapshot {
 public:
  // Copies the current state of `generators`.
  static absl::StatusOr<RngSnapshot> Capture(const DefaultGenerators& generators);

  // The state a freshly seeded set of default generators would have: CPU generator seeded with
  // `cpu_seed`, CUDA generator (when `generators` has one) with `cuda_seed` and offset 0.
  // Installing it is what manual_seed does, without touching the live generators.
  static absl::StatusOr<RngSnapshot> Seeded(const DefaultGenerators& generators, uint64_t cpu_seed,
                                            uint64_t cuda_seed);

  // A snapshot from serialized parts (see rng/stream_io.h). kInvalidArgument for CPU state bytes
  // of the wrong length for this LibTorch.
  static absl::StatusOr<RngSnapshot> FromParts(std::string cpu_state,
                                               std::optional<CudaGeneratorState> cuda);

  // Writes `cpu_state` (and `cuda`) into the live default generators without building a
  // snapshot: the lean path for states received from a peer. kInvalidArgument for CPU state
  // bytes of the wrong length.
  static absl::Status RestoreParts(absl::string_view cpu_state,
                                   const std::optional<CudaGeneratorState>& cuda);

  // Serialized size of a CPU generator's state in this LibTorch.
  static size_t CpuStateSize();

  // Writes this snapshot into the live default generators (the CPU generator, and the CUDA
  // generator of the snapshot's device if it has one).
  absl::Status Restore() const;

  // The CPU generator's serialized state (LibTorch's get_state() bytes).
  const std::string& cpu_state() const { return cpu_state_; }
  // The seed recorded in the CPU state (what manual_seed last set).
  uint64_t cpu_seed() const { return cpu_seed_; }
  const std::optional<CudaGeneratorState>& cuda() const { return cuda_; }
  DefaultGenerators generators() const {
    return DefaultGenerators{cuda_.has_value() ? cuda_->device : -1};
  }

  bool operator==(const RngSnapshot& o) const {
    return cpu_state_ == o.cpu_state_ && cuda_ == o.cuda_;
  }
  bool operator!=(const RngSnapshot& o) const { return !(*this == o); }

 private:
  RngSnapshot() = default;

  std::string cpu_state_;
  uint64_t cpu_seed_ = 0;
  std::optional<CudaGeneratorState> cuda_;
};

// Hooks through which a CUDA-enabled build provides the CUDA half (rng/cuda_generator_state.cc
// registers them at load time). Not for callers.
namespace internal {
struct CudaGeneratorHooks {
  absl::StatusOr<CudaGeneratorState> (*capture)(int device);
  absl::Status (*restore)(const CudaGeneratorState& state);
  // Whether this LibTorch has graph-safe generator state (graphsafe_get_state/set_state).
  bool graph_safe_supported = false;
};
void RegisterCudaGeneratorHooks(const CudaGeneratorHooks& hooks);

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

#endif  // LOCKSTEP_RNG_GENERATOR_STATE_H_
