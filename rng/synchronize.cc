#include "rng/synchronize.h"

#include <cstring>
#include <mutex>
#include <optional>
#include <string>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"

namespace lockstep {
namespace rng {
namespace {

// Wire layout: CPU state bytes, then (with CUDA) seed and offset as two little-endian uint64.
constexpr size_t kCudaBytes = 16;

void PutWord(uint8_t* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t GetWord(const uint8_t* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(in[i]) << (8 * i);
  return v;
}

}  // namespace

absl::Status Synchronize(collectives::Communicator* group, const DefaultGenerators& generators) {
  if (group == nullptr || group->size() <= 1) return absl::OkStatus();
  const std::string context =
      absl::StrCat("while synchronizing RNG state across ", group->DebugName());
  const size_t cpu_bytes = RngSnapshot::CpuStateSize();
  const size_t total = cpu_bytes + (generators.has_cuda() ? kCudaBytes : 0);
  at::Tensor wire;
  if (group->rank() == 0) {
    // Only the leader reads its state; the others overwrite theirs. The CPU generator's state
    // tensor is the wire itself when there is no CUDA half (no copies on the hot path).
    std::optional<CudaGeneratorState> cuda;
    if (generators.has_cuda()) {
      LOCKSTEP_ASSIGN_OR_RETURN(RngSnapshot mine, RngSnapshot::Capture(generators));
      if (mine.cuda()->in_capture.has_value()) {
        return absl::FailedPreconditionError(
            absl::StrCat(context,
                         ": CUDA graph capture is underway; the generator's position is "
                         "graph-relative there, so synchronize before capturing"));
      }
      cuda = mine.cuda();
    }
    LOCKSTEP_RETURN_IF_ERROR(CallTorch(context, [&] {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      at::Tensor cpu_state;
      {
        std::lock_guard<std::mutex> lock(gen.mutex());
        cpu_state = gen.get_state();
      }
      if (!cuda.has_value()) {
        wire = cpu_state;
        return;
      }
      wire = at::empty({static_cast<int64_t>(total)}, at::kByte);
      uint8_t* data = wire.data_ptr<uint8_t>();
      std::memcpy(data, cpu_state.data_ptr(), cpu_bytes);
      PutWord(data + cpu_bytes, cuda->seed);
      PutWord(data + cpu_bytes + 8, cuda->offset);
    }));
    if (static_cast<size_t>(wire.numel()) != total) {
      return absl::InternalError(absl::StrCat(context, ": the CPU generator's state has ",
                                              wire.numel(), " bytes, expected ", cpu_bytes));
    }
  } else {
    LOCKSTEP_RETURN_IF_ERROR(
        CallTorch(context, [&] { wire = at::empty({static_cast<int64_t>(total)}, at::kByte); }));
  }
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(group->Broadcast(wire, 0), context);
  if (group->rank() == 0) return absl::OkStatus();
  if (!generators.has_cuda()) {
    // The received tensor has exactly a CPU state's size; the generator checks its content.
    return CallTorch(absl::StrCat(context, ": installing the leader's CPU generator state"), [&] {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(wire);
    });
  }
  const uint8_t* data = wire.data_ptr<uint8_t>();
  const std::optional<CudaGeneratorState> cuda = CudaGeneratorState{
      generators.cuda_device, GetWord(data + cpu_bytes), GetWord(data + cpu_bytes + 8)};
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
      RngSnapshot::RestoreParts(absl::string_view(reinterpret_cast<const char*>(data), cpu_bytes),
                                cuda),
      context);
  return absl::OkStatus();
}

}  // namespace rng
}  // namespace lockstep
