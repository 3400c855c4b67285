#include "rng/snapshot.h"

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace rng {
namespace {

absl::Status NeedCuda(int device) { return internal::RequireCudaSupport(device); }

// Checks the parts before anything uses them: a valid CPU state, and a CUDA half only where
// CUDA is built in.
absl::Status CheckParts(const CpuGeneratorState& cpu,
                        const std::optional<CudaGeneratorState>& cuda) {
  if (absl::Status s = cpu.Validate(); !s.ok()) return s;
  if (!cuda.has_value()) return absl::OkStatus();
  if (!cuda->in_capture.has_value() && cuda->offset % 4 != 0) {
    // LibTorch keeps Philox offsets at multiples of 4; checked here so nothing is half written.
    return absl::InvalidArgumentError(absl::StrCat("CUDA generator offset ", cuda->offset,
                                                   " of device ", cuda->device,
                                                   " is not a multiple of 4"));
  }
  return NeedCuda(cuda->device);
}

}  // namespace

absl::Status RngSnapshot::RestoreParts(const CpuGeneratorState& cpu,
                                       const std::optional<CudaGeneratorState>& cuda) {
  if (absl::Status s = CheckParts(cpu, cuda); !s.ok()) return s;
  if (!cuda.has_value()) return WriteDefaultCpuGenerator(cpu);
  // Both or neither: if the CUDA half is refused (graph capture, bad offset), put the CPU
  // generator back as it was.
  absl::StatusOr<CpuGeneratorState> previous = ReadDefaultCpuGenerator();
  if (!previous.ok()) return previous.status();
  if (absl::Status s = WriteDefaultCpuGenerator(cpu); !s.ok()) return s;
  absl::Status restored = internal::CudaHooks()->restore(*cuda);
  if (!restored.ok()) (void)WriteDefaultCpuGenerator(*previous);
  return restored;
}

absl::StatusOr<RngSnapshot> RngSnapshot::Capture(const DefaultGenerators& generators) {
  RngSnapshot snapshot;
  absl::StatusOr<CpuGeneratorState> cpu = ReadDefaultCpuGenerator();
  if (!cpu.ok()) return cpu.status();
  snapshot.cpu_ = *cpu;
  if (generators.has_cuda()) {
    if (absl::Status s = NeedCuda(generators.cuda_device); !s.ok()) return s;
    absl::StatusOr<CudaGeneratorState> cuda =
        internal::CudaHooks()->capture(generators.cuda_device);
    if (!cuda.ok()) return cuda.status();
    snapshot.cuda_ = *cuda;
  }
  return snapshot;
}

absl::StatusOr<RngSnapshot> RngSnapshot::Seeded(const DefaultGenerators& generators,
                                                uint64_t cpu_seed, uint64_t cuda_seed) {
  RngSnapshot snapshot;
  snapshot.cpu_ = CpuGeneratorState::Seeded(cpu_seed);
  if (generators.has_cuda()) {
    if (absl::Status s = NeedCuda(generators.cuda_device); !s.ok()) return s;
    snapshot.cuda_ = CudaGeneratorState::Eager(generators.cuda_device, cuda_seed, 0);
  }
  return snapshot;
}

absl::StatusOr<RngSnapshot> RngSnapshot::FromParts(absl::string_view cpu_state,
                                                   std::optional<CudaGeneratorState> cuda) {
  absl::StatusOr<CpuGeneratorState> cpu = ParseTorchCpuState(cpu_state);
  if (!cpu.ok()) return cpu.status();
  return FromState(*cpu, std::move(cuda));
}

absl::StatusOr<RngSnapshot> RngSnapshot::FromState(const CpuGeneratorState& cpu,
                                                   std::optional<CudaGeneratorState> cuda) {
  if (absl::Status s = CheckParts(cpu, cuda); !s.ok()) return s;
  RngSnapshot snapshot;
  snapshot.cpu_ = cpu;
  snapshot.cuda_ = std::move(cuda);
  return snapshot;
}

absl::Status RngSnapshot::Restore() const { return RestoreParts(cpu_, cuda_); }

}  // namespace rng
}  // namespace lockstep
