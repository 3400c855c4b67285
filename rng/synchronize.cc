#include "rng/synchronize.h"

#include <cstring>
#include <optional>
#include <string>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"

namespace lockstep {
namespace rng {
namespace {

// Seed and offset of the CUDA generator, as two little-endian uint64 after the CPU state.
constexpr size_t kCudaBytes = 16;

void PutWord(uint8_t* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t GetWord(const uint8_t* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(in[i]) << (8 * i);
  return v;
}

constexpr size_t kCpuBytes = kCompactCpuStateBytes;

// Writes the leader's state into `data`: CPU state (compact encoding), then (with CUDA) seed and
// offset.
absl::Status WriteLeaderState(const DefaultGenerators& generators, const std::string& context,
                              uint8_t* data) {
  LOCKSTEP_ASSIGN_OR_RETURN(RngSnapshot mine, RngSnapshot::Capture(generators));
  EncodeCompact(mine.cpu(), data);
  if (!mine.cuda().has_value()) return absl::OkStatus();
  if (mine.cuda()->in_capture.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(context,
                     ": CUDA graph capture is underway; the generator's position is "
                     "graph-relative there, so synchronize before capturing"));
  }
  PutWord(data + kCpuBytes, mine.cuda()->seed);
  PutWord(data + kCpuBytes + 8, mine.cuda()->offset);
  return absl::OkStatus();
}

}  // namespace

size_t SynchronizeWireBytes(const DefaultGenerators& generators) {
  return kCpuBytes + (generators.has_cuda() ? kCudaBytes : 0) + 1;
}

absl::Status Synchronize(collectives::Communicator* group, const RankStreams& streams) {
  // Note [A group of one is no group]
  if (collectives::WithOthers(group) == nullptr) return absl::OkStatus();
  const DefaultGenerators& generators = streams.generators();
  const std::string context =
      absl::StrCat("while synchronizing RNG state across ", group->DebugName());
  // Refused locally, but only after the broadcast: the other members must not wait for us.
  absl::Status local;
  if (!streams.caller_state_live()) {
    local = absl::FailedPreconditionError(absl::StrCat(
        context,
        ": a model-stream scope or named-stream fork is active, so the live generators "
        "do not hold the caller's state; synchronize outside them"));
  }
  // Wire: the CPU state (compact encoding, cpu_generator_state.h), with CUDA the seed and offset,
  // and last a status byte: whether the leader could read its state. The leader always broadcasts,
  // so a failure on its side reaches the members at once instead of leaving them waiting for a
  // broadcast that never comes.
  const size_t total = SynchronizeWireBytes(generators);
  const size_t status_byte = total - 1;
  at::Tensor wire;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(context, [&] {
    wire = at::empty({static_cast<int64_t>(total)}, at::kByte);
    wire.data_ptr<uint8_t>()[status_byte] = 0;
  }));
  uint8_t* data = wire.data_ptr<uint8_t>();
  absl::Status leader_status;
  if (group->rank() == 0) {
    leader_status = local.ok() ? WriteLeaderState(generators, context, data) : local;
  }
  if (group->rank() == 0 && leader_status.ok()) data[status_byte] = 1;
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(group->Broadcast(wire, 0), context);
  if (group->rank() == 0) return leader_status;
  if (!local.ok()) return local;
  if (data[status_byte] != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(context, ": the group's leader (global rank ", group->global_ranks()[0],
                     ") could not read its RNG state; its own error says why"));
  }
  absl::StatusOr<CpuGeneratorState> cpu = DecodeCompact(data);
  if (!cpu.ok()) {
    return Annotate(cpu.status(), absl::StrCat(context, ": the state received from global rank ",
                                               group->global_ranks()[0], " is invalid"));
  }
  std::optional<CudaGeneratorState> cuda;
  if (generators.has_cuda()) {
    cuda = CudaGeneratorState::Eager(generators.cuda_device, GetWord(data + kCpuBytes),
                                     GetWord(data + kCpuBytes + 8));
  }
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(RngSnapshot::RestoreParts(*cpu, cuda), context);
  return absl::OkStatus();
}

}  // namespace rng
}  // namespace lockstep
