// rng/snapshot.h
//
// RngSnapshot is a value copy of the rank's default generators: the process's default CPU
// generator (its full state) and, when the rank has a CUDA device, that device's default CUDA
// generator (seed and Philox offset). Snapshots are values, never aliases: capturing copies the
// bytes out, so a snapshot does not change when the live generators advance afterwards, and
// restoring copies them back in.
//
// Which generators belong to the rank is a DefaultGenerators value (rng/generators.h): the CPU
// generator always, plus the CUDA generator of `cuda_device` only.
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
//   const DefaultGenerators gens = DefaultGenerators::WithCudaDevice(local_rank);
//   LOCKSTEP_ASSIGN_OR_RETURN(RngSnapshot before, RngSnapshot::Capture(gens));
//   RunSomethingRandom();
//   LOCKSTEP_RETURN_IF_ERROR(before.Restore());  // the draws above never happened

#ifndef LOCKSTEP_RNG_SNAPSHOT_H_
#define LOCKSTEP_RNG_SNAPSHOT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "rng/cpu_generator_state.h"
#include "rng/generators.h"

namespace lockstep {
namespace rng {

// A value copy of a rank's default generators (see the top of this file).
class RngSnapshot {
 public:
  // Copies the current state of `generators`.
  static absl::StatusOr<RngSnapshot> Capture(const DefaultGenerators& generators);

  // The state a freshly seeded set of default generators would have: CPU generator seeded with
  // `cpu_seed`, CUDA generator (when `generators` has one) with `cuda_seed` and offset 0.
  // Installing it is what manual_seed does, without touching the live generators.
  static absl::StatusOr<RngSnapshot> Seeded(const DefaultGenerators& generators, uint64_t cpu_seed,
                                            uint64_t cuda_seed);

  // A snapshot from serialized parts (see rng/resume_state.h): LibTorch's get_state() bytes of
  // the CPU generator, strictly validated (cpu_generator_state.h: kInvalidArgument for bytes
  // LibTorch could not have produced), and the CUDA half.
  static absl::StatusOr<RngSnapshot> FromParts(absl::string_view cpu_state,
                                               std::optional<CudaGeneratorState> cuda);
  // A snapshot from a CPU generator state (validated) and the CUDA half.
  static absl::StatusOr<RngSnapshot> FromState(const CpuGeneratorState& cpu,
                                               std::optional<CudaGeneratorState> cuda);

  // Writes `cpu` (and `cuda`) into the live default generators without building a snapshot:
  // the lean path for states received from a peer. Both or neither are written.
  static absl::Status RestoreParts(const CpuGeneratorState& cpu,
                                   const std::optional<CudaGeneratorState>& cuda);

  // Writes this snapshot into the live default generators (the CPU generator, and the CUDA
  // generator of the snapshot's device if it has one).
  absl::Status Restore() const;

  // The CPU generator's state.
  const CpuGeneratorState& cpu() const { return cpu_; }
  // The CPU generator's state as LibTorch's get_state() bytes (kTorchCpuStateBytes long).
  std::string cpu_state() const { return TorchCpuStateBytes(cpu_); }
  // The seed recorded in the CPU state (what manual_seed last set).
  uint64_t cpu_seed() const { return cpu_.seed; }
  // The CUDA generator's state; absent for a CPU-only snapshot.
  const std::optional<CudaGeneratorState>& cuda() const { return cuda_; }
  // The generators this is a snapshot of: the CPU generator, plus the CUDA generator of the
  // device of cuda() when it has one.
  DefaultGenerators generators() const {
    return cuda_.has_value() ? DefaultGenerators::WithCudaDevice(cuda_->device)
                             : DefaultGenerators::CpuOnly();
  }

  // Whether both hold equal states of the same generators (restoring either gives the same
  // draws).
  bool operator==(const RngSnapshot& o) const { return cpu_ == o.cpu_ && cuda_ == o.cuda_; }
  // Whether they differ in any generator's state.
  bool operator!=(const RngSnapshot& o) const { return !(*this == o); }

 private:
  RngSnapshot() = default;

  CpuGeneratorState cpu_;
  std::optional<CudaGeneratorState> cuda_;
};

}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_SNAPSHOT_H_
