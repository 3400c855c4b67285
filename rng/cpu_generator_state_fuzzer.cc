// Fuzz target (base/fuzz_target.h) for the CPU generator state parsers: LibTorch's get_state()
// form (ParseTorchCpuState) and the compact Synchronize wire form (DecodeCompact).
//
// Oracle: a parser returns kInvalidArgument or a state; an accepted state re-encodes to the very
// bytes it came from; it can be written into the live generator, reads back equal, and two
// restores of it draw identical values, through a regeneration of all 624 words and the cached
// normal samples (the draws differed when a position past the state array was accepted).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/fuzz_target.h"
#include "rng/cpu_generator_state.h"

namespace lockstep {
namespace rng {
namespace {

// Draws that read every part of the state: more than 624 words (a regeneration), normals whose
// second sample is cached, in float and double.
at::Tensor Draws() {
  return at::cat({at::rand({700}, at::kDouble), at::randn({3}, at::kDouble),
                  at::randn({3}).to(at::kDouble),
                  at::randint(0, 1 << 30, {5}, at::kLong).to(at::kDouble)});
}

void CheckRestoresIdentically(const CpuGeneratorState& state, const char* form) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    const absl::Status written = WriteDefaultCpuGenerator(state);
    LOCKSTEP_FUZZ_CHECK(written.ok(),
                        absl::StrCat(form, ": parsed but not writable: ", written.ToString()));
    absl::StatusOr<CpuGeneratorState> read = ReadDefaultCpuGenerator();
    LOCKSTEP_FUZZ_CHECK(read.ok() && *read == state,
                        absl::StrCat(form, ": the live generator does not hold what was written"));
  }
  LOCKSTEP_FUZZ_CHECK(WriteDefaultCpuGenerator(state).ok(), form);
  const at::Tensor first = Draws();
  LOCKSTEP_FUZZ_CHECK(WriteDefaultCpuGenerator(state).ok(), form);
  const at::Tensor second = Draws();
  LOCKSTEP_FUZZ_CHECK(at::equal(first, second),
                      absl::StrCat(form, ": two restores of one state drew different values"));
}

// The live default generator's state (for the seeds); aborts with a message when it is unreadable.
CpuGeneratorState LiveState() {
  absl::StatusOr<CpuGeneratorState> state = ReadDefaultCpuGenerator();
  LOCKSTEP_FUZZ_CHECK(state.ok(), absl::StrCat("seed: the live generator cannot be read: ",
                                               state.status().ToString()));
  return *std::move(state);
}

}  // namespace
}  // namespace rng

std::vector<std::string> FuzzSeeds() {
  using rng::CpuGeneratorState;
  std::vector<CpuGeneratorState> states = {CpuGeneratorState::Seeded(0),
                                           CpuGeneratorState::Seeded(0x123456789abcdefULL)};
  // Live states: part-way through the words, right before a regeneration, with cached normals.
  at::manual_seed(5);
  (void)at::rand({100});
  states.push_back(rng::LiveState());
  (void)at::randn({1});
  (void)at::randn({1}, at::kDouble);
  states.push_back(rng::LiveState());
  at::manual_seed(6);
  (void)at::rand({623}, at::kFloat);
  states.push_back(rng::LiveState());
  std::vector<std::string> seeds;
  for (const CpuGeneratorState& state : states) {
    seeds.push_back(rng::TorchCpuStateBytes(state));
    std::string compact(rng::kCompactCpuStateBytes, '\0');
    rng::EncodeCompact(state, reinterpret_cast<uint8_t*>(compact.data()));
    seeds.push_back(compact);
  }
  return seeds;
}

}  // namespace lockstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace rng = lockstep::rng;
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<rng::CpuGeneratorState> torch = rng::ParseTorchCpuState(bytes);
  if (torch.ok()) {
    LOCKSTEP_FUZZ_CHECK(rng::TorchCpuStateBytes(*torch) == bytes,
                        "accepted LibTorch state bytes re-encode differently");
    rng::CheckRestoresIdentically(*torch, "LibTorch form");
  } else {
    LOCKSTEP_FUZZ_CHECK(torch.status().code() == absl::StatusCode::kInvalidArgument,
                        torch.status().ToString());
  }
  if (size == rng::kCompactCpuStateBytes) {
    absl::StatusOr<rng::CpuGeneratorState> compact = rng::DecodeCompact(data);
    if (compact.ok()) {
      std::string again(rng::kCompactCpuStateBytes, '\0');
      rng::EncodeCompact(*compact, reinterpret_cast<uint8_t*>(again.data()));
      LOCKSTEP_FUZZ_CHECK(again == bytes, "accepted compact state bytes re-encode differently");
      rng::CheckRestoresIdentically(*compact, "compact form");
    } else {
      LOCKSTEP_FUZZ_CHECK(compact.status().code() == absl::StatusCode::kInvalidArgument,
                          compact.status().ToString());
    }
  }
  return 0;
}
