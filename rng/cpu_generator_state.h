// rng/cpu_generator_state.h
//
// CpuGeneratorState is the full state of a LibTorch CPU generator as a value: its mt19937 engine
// (seed, position, the 624 state words) and its cached normal samples. Snapshots, scopes and
// Synchronize read and write the live default CPU generator through it — a copy of a few
// kilobytes under the generator's lock, without LibTorch's get_state/set_state tensors — and it
// converts, bit for bit, to and from the bytes LibTorch's get_state produces (the form saved in
// resume states).
//
// Validation (Note [Valid CPU generator states]): a state is accepted only if LibTorch itself
// could have produced it. The mt19937 engine reads state word `next` after decrementing `left`
// and regenerates its words when `left` reaches 0; a LibTorch engine is either freshly seeded
// (left 1, next 0) or has drawn since (left + next == 625, 1 <= left <= 624). Any other position
// would make the engine read past its 624 words. The byte form must also be canonical: words and
// `next` within 32 bits, flags 0 or 1, the unused fields and every padding byte 0, no sample
// value without its flag, cached samples finite (Box-Muller never gives anything else) — so that
// re-encoding the parsed state gives the very same bytes. What fails is kInvalidArgument naming the
// field and the value.
//
// Thread-safety: values; ReadDefaultCpuGenerator/WriteDefaultCpuGenerator take the generator's
// lock.

#ifndef LOCKSTEP_RNG_CPU_GENERATOR_STATE_H_
#define LOCKSTEP_RNG_CPU_GENERATOR_STATE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lockstep {
namespace rng {

// The state of one LibTorch CPU generator (see the top of this file). Default-constructed it has
// every word 0, which no seed gives: start from Seeded or a parsed state.
struct CpuGeneratorState {
  static constexpr int kWords = 624;  // mt19937's state words

  // The seed the engine was last seeded with (what initial_seed() reports).
  uint64_t seed = 0;
  // Draws before the engine regenerates its words, plus one: 1 when freshly seeded, otherwise
  // 625 - next.
  int32_t left = 1;
  // Index of the next state word to read: 0 when freshly seeded, otherwise 1..624 (a draw with
  // left == 1 first regenerates the words and reads from 0).
  uint32_t next = 0;
  // mt19937's state words.
  std::array<uint32_t, kWords> words{};
  // The second sample of the last Box-Muller pair drawn for a float normal, which the next float
  // normal draw returns; absent when there is none.
  std::optional<float> next_float_normal;
  // As next_float_normal, for double normal draws.
  std::optional<double> next_double_normal;

  // The state mt19937(seed) starts in (what manual_seed installs), no cached samples.
  static CpuGeneratorState Seeded(uint64_t seed);

  // OK if the engine position is one LibTorch can produce (see the top of this file).
  absl::Status Validate() const;

  // Whether every field is equal: the two generators would draw the same values.
  bool operator==(const CpuGeneratorState& o) const;
  // Whether any field differs.
  bool operator!=(const CpuGeneratorState& o) const { return !(*this == o); }
};

// Size of LibTorch's get_state() bytes of a CPU generator.
inline constexpr size_t kTorchCpuStateBytes = 5056;

// The bytes LibTorch's CPUGeneratorImpl::get_state() returns for `state`.
std::string TorchCpuStateBytes(const CpuGeneratorState& state);

// Parses get_state() bytes, refusing any that LibTorch could not have produced
// (kInvalidArgument naming the field and the value).
absl::StatusOr<CpuGeneratorState> ParseTorchCpuState(absl::string_view bytes);

// lockstep's compact encoding (for Synchronize's wire): little-endian seed (8), left (4),
// next (4), the words (4 each), then per cached sample a flag byte and its value (4 / 8).
inline constexpr size_t kCompactCpuStateBytes =
    8 + 4 + 4 + 4 * CpuGeneratorState::kWords + 1 + 4 + 1 + 8;
// Writes `state` as kCompactCpuStateBytes bytes at `out` (not validated: encode only what
// Validate accepts, or what was decoded).
void EncodeCompact(const CpuGeneratorState& state, uint8_t* out);
// Decodes and validates kCompactCpuStateBytes bytes.
absl::StatusOr<CpuGeneratorState> DecodeCompact(const uint8_t* in);

// The live default CPU generator's state, and writing one into it (validated first: a bad state
// is refused and the generator left as it was).
absl::StatusOr<CpuGeneratorState> ReadDefaultCpuGenerator();
// Installs `state` in the live default CPU generator; kInvalidArgument (from Validate) for a state
// LibTorch could not have produced, and the generator is then left as it was.
absl::Status WriteDefaultCpuGenerator(const CpuGeneratorState& state);

}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_CPU_GENERATOR_STATE_H_
