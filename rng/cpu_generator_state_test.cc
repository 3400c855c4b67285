// rng/cpu_generator_state: the value form of a CPU generator agrees bit for bit with LibTorch's
// own get_state/set_state (for the LibTorch this binary is built against), and states LibTorch
// could not produce — positions that read past the engine's words among them — are refused.

#include "rng/cpu_generator_state.h"

#include <cstring>
#include <limits>
#include <mutex>
#include <string>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "ATen/core/Generator.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace rng {
namespace {

using ::testing::HasSubstr;

std::string LiveTorchBytes() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  at::Tensor state = gen.get_state();
  return std::string(static_cast<const char*>(state.data_ptr()), state.numel());
}

void SetCachedSamples(std::optional<float> f, std::optional<double> d) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  auto* impl = gen.get<at::CPUGeneratorImpl>();
  if (f.has_value())
    impl->set_next_float_normal_sample(*f);
  else
    impl->set_next_float_normal_sample({});
  if (d.has_value())
    impl->set_next_double_normal_sample(*d);
  else
    impl->set_next_double_normal_sample({});
}

// States reached the ways a run reaches them: seeding, drawing a few words, drawing past a
// regeneration of the 624 words, with and without cached normal samples.
std::vector<std::string> TorchStates() {
  std::vector<std::string> states;
  at::manual_seed(1234);
  states.push_back(LiveTorchBytes());  // fresh: left 1, next 0
  (void)at::randint(0, 1000, {3}, at::kLong);
  states.push_back(LiveTorchBytes());
  (void)at::rand({2000});  // past a regeneration
  states.push_back(LiveTorchBytes());
  SetCachedSamples(0.25f, -1.5);
  states.push_back(LiveTorchBytes());
  SetCachedSamples(std::nullopt, 3.0);
  states.push_back(LiveTorchBytes());
  SetCachedSamples(-0.0f, std::nullopt);
  states.push_back(LiveTorchBytes());
  SetCachedSamples(std::nullopt, std::nullopt);
  return states;
}

TEST(CpuGeneratorStateTest, BytesAgreeWithLibTorchBothWays) {
  ASSERT_EQ(LiveTorchBytes().size(), kTorchCpuStateBytes);
  for (const std::string& bytes : TorchStates()) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(CpuGeneratorState state, ParseTorchCpuState(bytes));
    EXPECT_EQ(TorchCpuStateBytes(state), bytes);
    // Reading the live generator gives the same state as parsing its get_state bytes.
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
      std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
      gen.set_state(t);
    }
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(CpuGeneratorState live, ReadDefaultCpuGenerator());
    EXPECT_EQ(live, state);
  }
}

TEST(CpuGeneratorStateTest, WritingAStateDrawsWhatSetStateDraws) {
  at::manual_seed(99);
  (void)at::rand({700});
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(CpuGeneratorState saved, ReadDefaultCpuGenerator());
  const at::Tensor expected = at::rand({1000});
  (void)at::rand({5});
  LOCKSTEP_ASSERT_OK(WriteDefaultCpuGenerator(saved));
  EXPECT_TRUE(at::equal(at::rand({1000}), expected));
  at::manual_seed(42);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const CpuGeneratorState seeded,
                                ParseTorchCpuState(LiveTorchBytes()));
  EXPECT_EQ(CpuGeneratorState::Seeded(42), seeded);
}

TEST(CpuGeneratorStateTest, PositionsThatReadPastTheWordsAreRefused) {
  CpuGeneratorState state = CpuGeneratorState::Seeded(7);
  LOCKSTEP_EXPECT_OK(state.Validate());
  // The position of the issue: left + next > 625 passed a check of each field alone.
  state.left = 300;
  state.next = 400;
  const absl::Status refused = state.Validate();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("left 300, next 400"));
  EXPECT_EQ(WriteDefaultCpuGenerator(state).code(), absl::StatusCode::kInvalidArgument);
  for (auto [left, next] : std::vector<std::pair<int32_t, uint32_t>>{
           {0, 0}, {625, 0}, {1, 1}, {624, 0}, {-5, 630}, {1, 625}, {2, 624}}) {
    state.left = left;
    state.next = next;
    EXPECT_FALSE(state.Validate().ok()) << left << ", " << next;
  }
  for (auto [left, next] :
       std::vector<std::pair<int32_t, uint32_t>>{{1, 0}, {624, 1}, {1, 624}, {300, 325}}) {
    state.left = left;
    state.next = next;
    EXPECT_TRUE(state.Validate().ok()) << left << ", " << next;
  }
}

TEST(CpuGeneratorStateTest, NonCanonicalBytesAreRefusedNamingTheField) {
  at::manual_seed(5);
  (void)at::rand({10});
  const std::string good = LiveTorchBytes();
  auto with = [&](size_t at, const void* value, size_t size) {
    std::string bytes = good;
    std::memcpy(bytes.data() + at, value, size);
    return ParseTorchCpuState(bytes).status();
  };
  const uint64_t big_next = (uint64_t{1} << 32) + 3;  // LibTorch would read only the low 3
  EXPECT_THAT(with(16, &big_next, 8).message(), HasSubstr("next is 4294967299"));
  const uint64_t big_word = uint64_t{1} << 40;
  EXPECT_THAT(with(24 + 8 * 5, &big_word, 8).message(), HasSubstr("state word 5"));
  const int32_t seeded = 0;
  EXPECT_THAT(with(12, &seeded, 4).message(), HasSubstr("seeded flag is 0"));
  const int32_t valid = 2;
  EXPECT_THAT(with(5040, &valid, 4).message(), HasSubstr("normal_is_valid is 2"));
  const double normal_x = 1.0;
  EXPECT_THAT(with(5016, &normal_x, 8).message(), HasSubstr("(normal_x (unused))"));
  const uint8_t padding = 1;
  EXPECT_THAT(with(5055, &padding, 1).message(), HasSubstr("byte 5055 (padding)"));
  EXPECT_THAT(with(5044, &padding, 1).message(), HasSubstr("byte 5044 (padding)"));
  const float sample_without_flag = 0.5f;
  EXPECT_THAT(with(5048, &sample_without_flag, 4).message(),
              HasSubstr("(next_float_normal_sample)"));
  EXPECT_THAT(ParseTorchCpuState(good.substr(0, 100)).status().message(),
              HasSubstr("has 100 bytes; LibTorch's has 5056"));
}

// Every single-byte change of a real state is either refused or parses to a state whose bytes
// are exactly the changed bytes: nothing is accepted that LibTorch would read differently.
TEST(CpuGeneratorStateTest, EverySingleByteFlipIsRefusedOrExact) {
  at::manual_seed(11);
  (void)at::rand({100});
  const std::string good = LiveTorchBytes();
  int accepted = 0, refused = 0;
  for (size_t at = 0; at < good.size(); ++at) {
    for (uint8_t flip : {0x01, 0x80, 0xff}) {
      std::string bytes = good;
      bytes[at] = static_cast<char>(bytes[at] ^ flip);
      absl::StatusOr<CpuGeneratorState> parsed = ParseTorchCpuState(bytes);
      if (!parsed.ok()) {
        ++refused;
        continue;
      }
      ++accepted;
      ASSERT_EQ(TorchCpuStateBytes(*parsed), bytes) << "byte " << at;
      ASSERT_TRUE(parsed->Validate().ok());
    }
  }
  EXPECT_GT(accepted, 0);  // the state words and the seed may be anything
  EXPECT_GT(refused, 0);
}

TEST(CpuGeneratorStateTest, CompactEncodingRoundTripsAndValidates) {
  at::manual_seed(3);
  (void)at::rand({50});
  SetCachedSamples(1.5f, std::nullopt);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(CpuGeneratorState state, ReadDefaultCpuGenerator());
  SetCachedSamples(std::nullopt, std::nullopt);
  std::vector<uint8_t> wire(kCompactCpuStateBytes);
  EncodeCompact(state, wire.data());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(CpuGeneratorState decoded, DecodeCompact(wire.data()));
  EXPECT_EQ(decoded, state);
  const int32_t bad_left = 500;  // with next 51: past the words
  std::memcpy(wire.data() + 8, &bad_left, 4);
  EXPECT_EQ(DecodeCompact(wire.data()).status().code(), absl::StatusCode::kInvalidArgument);
  EncodeCompact(state, wire.data());
  wire[8 + 4 + 4 + 4 * 624] = 7;  // the float sample's flag
  EXPECT_EQ(DecodeCompact(wire.data()).status().code(), absl::StatusCode::kInvalidArgument);
  // A NaN cached sample (found by the fuzzer): LibTorch never caches one.
  EncodeCompact(state, wire.data());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(wire.data() + 8 + 4 + 4 + 4 * 624 + 1, &nan, 4);
  const absl::Status not_finite = DecodeCompact(wire.data()).status();
  EXPECT_EQ(not_finite.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(not_finite.message(), ::testing::HasSubstr("cached float normal sample"));
  // The double sample has no flag: its bytes must be zero (one encoding per state).
  EncodeCompact(state, wire.data());
  wire[kCompactCpuStateBytes - 1] = 0x80;
  const absl::Status stray = DecodeCompact(wire.data()).status();
  EXPECT_EQ(stray.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(stray.message(), ::testing::HasSubstr("set although its flag is 0"));
}

}  // namespace
}  // namespace rng
}  // namespace lockstep
