#include "rng/snapshot.h"

#include <cstring>
#include <mutex>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "ATen/core/Generator.h"
#include "absl/strings/str_cat.h"
#include "base/torch_boundary.h"

namespace lockstep {
namespace rng {
namespace {

absl::Status NeedCuda(int device) { return internal::RequireCudaSupport(device); }

std::string TensorBytes(const at::Tensor& t) {
  return std::string(static_cast<const char*>(t.data_ptr()), t.numel());
}

// A CPU byte tensor holding `bytes` (the inverse of TensorBytes).
at::Tensor BytesTensor(absl::string_view bytes) {
  at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

// Reads the live default CPU generator's state bytes (and its seed, when asked).
absl::Status ReadCpuState(std::string* bytes, uint64_t* seed) {
  return CallTorch("reading the default CPU generator", [&] {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    *bytes = TensorBytes(gen.get_state());
    if (seed != nullptr) *seed = gen.current_seed();
  });
}

absl::Status WriteCpuState(absl::string_view cpu_state) {
  return CallTorch("restoring the default CPU generator", [&] {
    at::Tensor bytes = BytesTensor(cpu_state);
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(bytes);
  });
}

// Checks serialized parts before anything uses them: CPU state of this LibTorch's size, and a
// CUDA half only where CUDA is built in.
absl::Status CheckParts(absl::string_view cpu_state,
                        const std::optional<CudaGeneratorState>& cuda) {
  if (cpu_state.size() != RngSnapshot::CpuStateSize()) {
    return absl::InvalidArgumentError(absl::StrCat("CPU generator state has ", cpu_state.size(),
                                                   " bytes; this LibTorch's has ",
                                                   RngSnapshot::CpuStateSize()));
  }
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

size_t RngSnapshot::CpuStateSize() {
  static const size_t size = [] {
    at::Generator fresh = at::make_generator<at::CPUGeneratorImpl>(0);
    return static_cast<size_t>(fresh.get_state().numel());
  }();
  return size;
}

absl::Status RngSnapshot::RestoreParts(absl::string_view cpu_state,
                                       const std::optional<CudaGeneratorState>& cuda) {
  if (absl::Status s = CheckParts(cpu_state, cuda); !s.ok()) return s;
  if (!cuda.has_value()) return WriteCpuState(cpu_state);
  // Both or neither: if the CUDA half is refused (graph capture, bad offset), put the CPU
  // generator back as it was.
  std::string previous;
  if (absl::Status s = ReadCpuState(&previous, nullptr); !s.ok()) return s;
  if (absl::Status s = WriteCpuState(cpu_state); !s.ok()) return s;
  absl::Status restored = internal::CudaHooks()->restore(*cuda);
  if (!restored.ok()) (void)WriteCpuState(previous);
  return restored;
}

absl::StatusOr<RngSnapshot> RngSnapshot::Capture(const DefaultGenerators& generators) {
  RngSnapshot snapshot;
  if (absl::Status s = ReadCpuState(&snapshot.cpu_state_, &snapshot.cpu_seed_); !s.ok()) return s;
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
  absl::Status status = CallTorch("seeding a CPU generator", [&] {
    at::Generator fresh = at::make_generator<at::CPUGeneratorImpl>(cpu_seed);
    snapshot.cpu_state_ = TensorBytes(fresh.get_state());
    snapshot.cpu_seed_ = cpu_seed;
  });
  if (!status.ok()) return status;
  if (generators.has_cuda()) {
    if (absl::Status s = NeedCuda(generators.cuda_device); !s.ok()) return s;
    snapshot.cuda_ = CudaGeneratorState::Eager(generators.cuda_device, cuda_seed, 0);
  }
  return snapshot;
}

absl::StatusOr<RngSnapshot> RngSnapshot::FromParts(std::string cpu_state,
                                                   std::optional<CudaGeneratorState> cuda) {
  if (absl::Status s = CheckParts(cpu_state, cuda); !s.ok()) return s;
  RngSnapshot snapshot;
  absl::Status status = CallTorch("reading a CPU generator state", [&] {
    at::Generator probe = at::make_generator<at::CPUGeneratorImpl>(0);
    at::Tensor bytes = BytesTensor(cpu_state);
    probe.set_state(bytes);
    snapshot.cpu_seed_ = probe.current_seed();
  });
  if (!status.ok()) return status;
  snapshot.cpu_state_ = std::move(cpu_state);
  snapshot.cuda_ = cuda;
  return snapshot;
}

absl::Status RngSnapshot::Restore() const { return RestoreParts(cpu_state_, cuda_); }

}  // namespace rng
}  // namespace lockstep
