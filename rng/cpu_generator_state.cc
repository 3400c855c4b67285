#include "rng/cpu_generator_state.h"

#include <cmath>
#include <cstring>
#include <mutex>

#include "ATen/CPUGeneratorImpl.h"
#include "ATen/core/Generator.h"
#include "ATen/core/MT19937RNGEngine.h"
#include "absl/strings/str_cat.h"
#include "base/torch_boundary.h"

namespace lockstep {
namespace rng {
namespace {

static_assert(CpuGeneratorState::kWords == at::MERSENNE_STATE_N, "mt19937 has 624 state words");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "LibTorch's state bytes are host order");

// Byte offsets of LibTorch's CPUGeneratorImplState (get_state's layout on x86-64 and aarch64):
// the legacy POD { u64 the_initial_seed; int left; int seeded; u64 next; u64 state[624];
// double normal_x, normal_y, normal_rho; int normal_is_valid; [4 padding] } = 5048 bytes, then
// float next_float_normal_sample; bool is_next_float_normal_sample_valid; [3 padding].
constexpr size_t kSeedAt = 0, kLeftAt = 8, kSeededAt = 12, kNextAt = 16, kWordsAt = 24;
constexpr size_t kNormalXAt = kWordsAt + 8 * CpuGeneratorState::kWords;  // 5016
constexpr size_t kNormalYAt = kNormalXAt + 8, kNormalRhoAt = kNormalXAt + 16;
constexpr size_t kNormalValidAt = kNormalXAt + 24;  // 5040
constexpr size_t kFloatSampleAt = 5048, kFloatValidAt = 5052;
static_assert(kFloatValidAt + 4 == kTorchCpuStateBytes, "layout of CPUGeneratorImplState");

template <typename T>
void Put(uint8_t* out, size_t at, T value) {
  std::memcpy(out + at, &value, sizeof(T));
}
template <typename T>
T Get(const uint8_t* in, size_t at) {
  T value;
  std::memcpy(&value, in + at, sizeof(T));
  return value;
}

// The field of get_state's layout that byte `at` belongs to, for error messages.
std::string FieldAt(size_t at) {
  if (at < kLeftAt) return "the_initial_seed";
  if (at < kSeededAt) return "left";
  if (at < kNextAt) return "seeded";
  if (at < kWordsAt) return "next";
  if (at < kNormalXAt) return absl::StrCat("state word ", (at - kWordsAt) / 8);
  if (at < kNormalYAt) return "normal_x (unused)";
  if (at < kNormalRhoAt) return "normal_y";
  if (at < kNormalValidAt) return "normal_rho (unused)";
  if (at < kNormalValidAt + 4) return "normal_is_valid";
  if (at < kFloatSampleAt) return "padding";
  if (at < kFloatValidAt) return "next_float_normal_sample";
  if (at == kFloatValidAt) return "is_next_float_normal_sample_valid";
  return "padding";
}

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("CPU generator state: ", field, " ", why, "; LibTorch cannot produce it"));
}

}  // namespace

CpuGeneratorState CpuGeneratorState::Seeded(uint64_t seed) {
  const at::mt19937_data_pod data = at::mt19937(seed).data();
  CpuGeneratorState state;
  state.seed = data.seed_;
  state.left = data.left_;
  state.next = data.next_;
  std::copy(data.state_.begin(), data.state_.end(), state.words.begin());
  return state;
}

// Note [Valid CPU generator states]: see the top of cpu_generator_state.h.
absl::Status CpuGeneratorState::Validate() const {
  const bool fresh = left == 1 && next == 0;
  const bool drawn = left >= 1 && left <= kWords && next >= 1 && next <= uint32_t{kWords} &&
                     static_cast<int64_t>(left) + next == kWords + 1;
  if (!fresh && !drawn) {
    return Invalid(absl::StrCat("position (left ", left, ", next ", next, ")"),
                   "is neither freshly seeded (1, 0) nor left + next == 625 with left in "
                   "[1, 624], and would make the engine read past its 624 words");
  }
  // LibTorch caches the second Box-Muller sample, always finite: a NaN or infinity is no state
  // it produces (and a NaN would make two equal states compare unequal).
  if (next_float_normal.has_value() && !std::isfinite(*next_float_normal)) {
    return Invalid("cached float normal sample",
                   absl::StrCat("is ", *next_float_normal, ", not finite"));
  }
  if (next_double_normal.has_value() && !std::isfinite(*next_double_normal)) {
    return Invalid("cached double normal sample",
                   absl::StrCat("is ", *next_double_normal, ", not finite"));
  }
  return absl::OkStatus();
}

bool CpuGeneratorState::operator==(const CpuGeneratorState& o) const {
  return seed == o.seed && left == o.left && next == o.next && words == o.words &&
         next_float_normal == o.next_float_normal && next_double_normal == o.next_double_normal;
}

std::string TorchCpuStateBytes(const CpuGeneratorState& state) {
  std::string bytes(kTorchCpuStateBytes, '\0');  // padding and unused fields stay 0
  uint8_t* out = reinterpret_cast<uint8_t*>(bytes.data());
  Put<uint64_t>(out, kSeedAt, state.seed);
  Put<int32_t>(out, kLeftAt, state.left);
  Put<int32_t>(out, kSeededAt, 1);
  Put<uint64_t>(out, kNextAt, state.next);
  for (int i = 0; i < CpuGeneratorState::kWords; ++i) {
    Put<uint64_t>(out, kWordsAt + 8 * i, state.words[i]);
  }
  if (state.next_double_normal.has_value()) {
    Put<int32_t>(out, kNormalValidAt, 1);
    Put<double>(out, kNormalYAt, *state.next_double_normal);
  }
  if (state.next_float_normal.has_value()) {
    Put<uint8_t>(out, kFloatValidAt, 1);
    Put<float>(out, kFloatSampleAt, *state.next_float_normal);
  }
  return bytes;
}

absl::StatusOr<CpuGeneratorState> ParseTorchCpuState(absl::string_view bytes) {
  if (bytes.size() != kTorchCpuStateBytes) {
    return absl::InvalidArgumentError(absl::StrCat("CPU generator state has ", bytes.size(),
                                                   " bytes; LibTorch's has ", kTorchCpuStateBytes));
  }
  const uint8_t* in = reinterpret_cast<const uint8_t*>(bytes.data());
  CpuGeneratorState state;
  state.seed = Get<uint64_t>(in, kSeedAt);
  state.left = Get<int32_t>(in, kLeftAt);
  const int32_t seeded = Get<int32_t>(in, kSeededAt);
  if (seeded != 1) return Invalid("seeded flag", absl::StrCat("is ", seeded, ", not 1"));
  const uint64_t next = Get<uint64_t>(in, kNextAt);
  if (next > CpuGeneratorState::kWords) {
    return Invalid("next", absl::StrCat("is ", next, ", past the 624 words"));
  }
  state.next = static_cast<uint32_t>(next);
  for (int i = 0; i < CpuGeneratorState::kWords; ++i) {
    const uint64_t word = Get<uint64_t>(in, kWordsAt + 8 * i);
    if (word > 0xffffffffu) {
      return Invalid(absl::StrCat("state word ", i), absl::StrCat("is ", word, ", over 32 bits"));
    }
    state.words[i] = static_cast<uint32_t>(word);
  }
  const int32_t double_valid = Get<int32_t>(in, kNormalValidAt);
  if (double_valid != 0 && double_valid != 1) {
    return Invalid("normal_is_valid", absl::StrCat("is ", double_valid, ", not 0 or 1"));
  }
  if (double_valid == 1) state.next_double_normal = Get<double>(in, kNormalYAt);
  const uint8_t float_valid = Get<uint8_t>(in, kFloatValidAt);
  if (float_valid > 1) {
    return Invalid("is_next_float_normal_sample_valid",
                   absl::StrCat("is ", float_valid, ", not 0 or 1"));
  }
  if (float_valid == 1) state.next_float_normal = Get<float>(in, kFloatSampleAt);
  if (absl::Status s = state.Validate(); !s.ok()) return s;
  // Everything else (normal_x, normal_rho, a sample without its flag, padding) is 0 in the bytes
  // LibTorch writes: the canonical re-encoding must give the same bytes.
  const std::string canonical = TorchCpuStateBytes(state);
  if (canonical != bytes) {
    size_t at = 0;
    while (at < bytes.size() && canonical[at] == bytes[at]) ++at;
    return Invalid(absl::StrCat("byte ", at, " (", FieldAt(at), ")"),
                   absl::StrCat("is ", static_cast<int>(static_cast<uint8_t>(bytes[at])),
                                " where LibTorch writes ",
                                static_cast<int>(static_cast<uint8_t>(canonical[at])),
                                " (unused fields and padding are 0)"));
  }
  return state;
}

void EncodeCompact(const CpuGeneratorState& state, uint8_t* out) {
  size_t at = 0;
  Put<uint64_t>(out, at, state.seed), at += 8;
  Put<int32_t>(out, at, state.left), at += 4;
  Put<uint32_t>(out, at, state.next), at += 4;
  std::memcpy(out + at, state.words.data(), 4 * CpuGeneratorState::kWords);
  at += 4 * CpuGeneratorState::kWords;
  Put<uint8_t>(out, at, state.next_float_normal.has_value() ? 1 : 0), at += 1;
  Put<float>(out, at, state.next_float_normal.value_or(0.0f)), at += 4;
  Put<uint8_t>(out, at, state.next_double_normal.has_value() ? 1 : 0), at += 1;
  Put<double>(out, at, state.next_double_normal.value_or(0.0));
}

absl::StatusOr<CpuGeneratorState> DecodeCompact(const uint8_t* in) {
  CpuGeneratorState state;
  size_t at = 0;
  state.seed = Get<uint64_t>(in, at), at += 8;
  state.left = Get<int32_t>(in, at), at += 4;
  state.next = Get<uint32_t>(in, at), at += 4;
  std::memcpy(state.words.data(), in + at, 4 * CpuGeneratorState::kWords);
  at += 4 * CpuGeneratorState::kWords;
  const uint8_t float_valid = Get<uint8_t>(in, at);
  at += 1;
  const float float_sample = Get<float>(in, at);
  const bool float_bytes_zero = Get<uint32_t>(in, at) == 0;
  at += 4;
  const uint8_t double_valid = Get<uint8_t>(in, at);
  at += 1;
  const double double_sample = Get<double>(in, at);
  const bool double_bytes_zero = Get<uint64_t>(in, at) == 0;
  if (float_valid > 1 || double_valid > 1) {
    return Invalid("cached-sample flag", "is neither 0 nor 1");
  }
  // Canonical, as the LibTorch form: a sample without its flag must be all-zero bytes, so that
  // one state has one encoding (equal states, equal wire bytes).
  if ((float_valid == 0 && !float_bytes_zero) || (double_valid == 0 && !double_bytes_zero)) {
    return Invalid("cached-sample value", "is set although its flag is 0");
  }
  if (float_valid == 1) state.next_float_normal = float_sample;
  if (double_valid == 1) state.next_double_normal = double_sample;
  if (absl::Status s = state.Validate(); !s.ok()) return s;
  return state;
}

absl::StatusOr<CpuGeneratorState> ReadDefaultCpuGenerator() {
  CpuGeneratorState state;
  absl::Status status = CallTorch("reading the default CPU generator", [&] {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    auto* impl = gen.get<at::CPUGeneratorImpl>();
    const at::mt19937_data_pod data = impl->engine().data();
    state.seed = data.seed_;
    state.left = data.left_;
    state.next = data.next_;
    std::copy(data.state_.begin(), data.state_.end(), state.words.begin());
    if (auto sample = impl->next_float_normal_sample()) state.next_float_normal = *sample;
    if (auto sample = impl->next_double_normal_sample()) state.next_double_normal = *sample;
  });
  if (!status.ok()) return status;
  return state;
}

absl::Status WriteDefaultCpuGenerator(const CpuGeneratorState& state) {
  if (absl::Status s = state.Validate(); !s.ok()) return s;
  return CallTorch("writing the default CPU generator", [&] {
    at::mt19937_data_pod data{};
    data.seed_ = state.seed;
    data.left_ = state.left;
    data.seeded_ = true;
    data.next_ = state.next;
    std::copy(state.words.begin(), state.words.end(), data.state_.begin());
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    auto* impl = gen.get<at::CPUGeneratorImpl>();
    // A copy of the live engine, overwritten: a default-constructed one would first seed all
    // 624 words, which is most of a model-stream scope's cost.
    at::mt19937 engine = impl->engine();
    engine.set_data(data);
    impl->set_engine(engine);
    if (state.next_float_normal.has_value()) {
      impl->set_next_float_normal_sample(*state.next_float_normal);
    } else {
      impl->set_next_float_normal_sample({});
    }
    if (state.next_double_normal.has_value()) {
      impl->set_next_double_normal_sample(*state.next_double_normal);
    } else {
      impl->set_next_double_normal_sample({});
    }
  });
}

}  // namespace rng
}  // namespace lockstep
