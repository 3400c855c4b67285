#include "rng/philox.h"

#include <cmath>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/core/grad_mode.h"
#include "absl/status/statusor.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace rng {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const c10::Device kCpu(c10::kCPU);

// Known-answer vectors of Philox4x32-10 published with Random123 (kat_vectors).
TEST(PhiloxTest, KnownAnswers) {
  EXPECT_THAT(Philox4x32({0, 0, 0, 0}, {0, 0}),
              ElementsAre(0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u));
  EXPECT_THAT(
      Philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
      ElementsAre(0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu));
  EXPECT_THAT(
      Philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
      ElementsAre(0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u));
}

TEST(PhiloxTest, ElementValueIsTheDocumentedWordOfItsBlock) {
  const PhiloxKey key{0x0123456789abcdefull, 3, 9};
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor u, PartitionedUniform(key, {10}, {{0, 10}}, kCpu));
  for (int64_t i = 0; i < 10; ++i) {
    const auto words =
        Philox4x32({static_cast<uint32_t>(i / 4), 0, 9, 3}, {0x89abcdefu, 0x01234567u});
    EXPECT_EQ(u[i].item<float>(), static_cast<float>(words[i % 4] >> 8) / 16777216.0f) << i;
  }
}

// Beyond one parallel_for chunk (2^15 elements) and across its boundaries, with a block that
// straddles one: every element is the documented word of its block. A shard of the same range,
// offset so its chunk boundaries fall elsewhere, gives the same values.
TEST(PhiloxTest, EveryElementOfALargeTensorIsItsDocumentedWord) {
  const PhiloxKey key{0xfeedfacecafebeefull, 11, 5};
  const int64_t n = 3 * (1 << 15) + 7;
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor u, PartitionedUniform(key, {n}, {{0, n}}, kCpu));
  const float* got = u.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    const auto words =
        Philox4x32({static_cast<uint32_t>(i / 4), static_cast<uint32_t>(i >> 34), 5, 11},
                   {0xcafebeefu, 0xfeedfaceu});
    ASSERT_EQ(got[i], static_cast<float>(words[i % 4] >> 8) / 16777216.0f) << i;
  }
  const int64_t begin = (1 << 15) - 3, end = n - 2;
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor shard,
                                PartitionedUniform(key, {n}, {{begin, end}}, kCpu));
  EXPECT_TRUE(at::equal(shard, u.slice(0, begin, end)));
}

absl::StatusOr<at::Tensor> Full(const PhiloxKey& key, std::vector<int64_t> shape) {
  std::vector<Slice> box;
  for (int64_t s : shape) box.push_back({0, s});
  return PartitionedUniform(key, shape, box, kCpu);
}

TEST(PartitionInvarianceTest, TpColumnSplitsEqualTheSliceOfTheUnshardedValues) {
  const PhiloxKey key{42, 1, 0};
  const std::vector<int64_t> shape = {6, 16};
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor full, Full(key, shape));
  for (int tp : {1, 2, 4, 8}) {
    std::vector<at::Tensor> shards;
    for (int r = 0; r < tp; ++r) {
      const int64_t w = 16 / tp;
      LOCKSTEP_ASSERT_OK_AND_ASSIGN(
          at::Tensor shard, PartitionedUniform(key, shape, {{0, 6}, {r * w, (r + 1) * w}}, kCpu));
      shards.push_back(shard);
      EXPECT_TRUE(at::equal(shards.back(), full.slice(1, r * w, (r + 1) * w))) << tp << " " << r;
    }
    EXPECT_TRUE(at::equal(at::cat(shards, 1), full));
  }
}

TEST(PartitionInvarianceTest, CpZigzagChunksEqualTheSliceOfTheUnshardedValues) {
  // [batch, sequence, hidden]; the sequence splits into 2 x CP chunks, rank i owning chunks i
  // and 2CP-1-i (load balance for causal attention).
  const PhiloxKey key{7, 2, 5};
  const std::vector<int64_t> shape = {2, 24, 3};
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor full, Full(key, shape));
  for (int cp : {1, 2, 3}) {
    const int64_t chunk = 24 / (2 * cp);
    for (int r = 0; r < cp; ++r) {
      const int64_t a = r * chunk, b = (2 * cp - 1 - r) * chunk;
      LOCKSTEP_ASSERT_OK_AND_ASSIGN(
          at::Tensor first, PartitionedUniform(key, shape, {{0, 2}, {a, a + chunk}, {0, 3}}, kCpu));
      LOCKSTEP_ASSERT_OK_AND_ASSIGN(
          at::Tensor second,
          PartitionedUniform(key, shape, {{0, 2}, {b, b + chunk}, {0, 3}}, kCpu));
      at::Tensor expected = at::cat({full.slice(1, a, a + chunk), full.slice(1, b, b + chunk)}, 1);
      EXPECT_TRUE(at::equal(at::cat({first, second}, 1), expected)) << cp << " " << r;
    }
  }
}

TEST(PartitionInvarianceTest, UnevenAndEmptyShardsAndArbitraryBoxes) {
  const PhiloxKey key{99, 0, 1};
  const std::vector<int64_t> shape = {5, 7, 3};
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor full, Full(key, shape));
  // Uneven split of the middle dimension: 3 + 3 + 1 + 0.
  const std::vector<std::pair<int64_t, int64_t>> parts = {{0, 3}, {3, 6}, {6, 7}, {7, 7}};
  for (auto [b, e] : parts) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor shard,
                                  PartitionedUniform(key, shape, {{0, 5}, {b, e}, {0, 3}}, kCpu));
    EXPECT_EQ(shard.sizes(), (std::vector<int64_t>{5, e - b, 3}));
    EXPECT_TRUE(at::equal(shard, full.slice(1, b, e)));
  }
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor box,
                                PartitionedUniform(key, shape, {{1, 4}, {2, 5}, {1, 3}}, kCpu));
  EXPECT_TRUE(at::equal(box, full.slice(0, 1, 4).slice(1, 2, 5).slice(2, 1, 3)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor empty,
                                PartitionedUniform(key, shape, {{0, 0}, {0, 7}, {0, 3}}, kCpu));
  EXPECT_EQ(empty.numel(), 0);
}

TEST(PartitionInvarianceTest, DropoutOfAShardIsTheSliceOfUnshardedDropout) {
  const PhiloxKey key{1234, 4, 2};
  const std::vector<int64_t> shape = {8, 32};
  at::manual_seed(0);
  at::Tensor input = at::randn(shape);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor full,
                                PartitionedDropout(input, key, shape, {{0, 8}, {0, 32}}, 0.25));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor mask,
                                PartitionedDropoutMask(key, shape, {{0, 8}, {0, 32}}, 0.25, kCpu));
  // Bit for bit: kept values are x * float(1 / 0.75), as the header promises.
  EXPECT_TRUE(at::equal(full, input * mask.to(at::kFloat) * (1.0f / 0.75f)));
  for (int r = 0; r < 4; ++r) {
    at::Tensor shard = input.slice(1, r * 8, (r + 1) * 8).contiguous();
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(
        at::Tensor out,
        PartitionedDropout(shard, key, shape, {{0, 8}, {r * 8, (r + 1) * 8}}, 0.25));
    EXPECT_TRUE(at::equal(out, full.slice(1, r * 8, (r + 1) * 8))) << r;
  }
  // Different steps and streams give different masks.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      const at::Tensor next_step,
      PartitionedDropoutMask({1234, 4, 3}, shape, {{0, 8}, {0, 32}}, 0.25, kCpu));
  EXPECT_FALSE(at::equal(mask, next_step));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      const at::Tensor other_stream,
      PartitionedDropoutMask({1234, 5, 2}, shape, {{0, 8}, {0, 32}}, 0.25, kCpu));
  EXPECT_FALSE(at::equal(mask, other_stream));
}

TEST(PartitionInvarianceTest, DropoutScalesInTheShardsPrecision) {
  const PhiloxKey key{0xfeedfacecafebeefull, 3, 11};
  const std::vector<int64_t> shape = {6, 40, 7};
  const std::vector<Slice> box = {{0, 6}, {0, 40}, {0, 7}};
  at::manual_seed(1);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor mask,
                                PartitionedDropoutMask(key, shape, box, 0.25, kCpu));
  for (at::ScalarType type : {at::kDouble, at::kFloat}) {
    at::Tensor x = at::randn(shape).to(type);
    at::Tensor want = at::where(mask, x * (1.0 / 0.75), at::zeros_like(x));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor dropped,
                                  PartitionedDropout(x, key, shape, box, 0.25));
    EXPECT_TRUE(at::equal(dropped, want)) << c10::toString(type);
  }
}

TEST(PartitionInvarianceTest, KeepRateAndUniformMomentsAreWithinStatisticalBounds) {
  const int64_t n = 1 << 20;
  for (double p : {0.1, 0.5, 0.9}) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor mask,
                                  PartitionedDropoutMask({17, 0, 0}, {n}, {{0, n}}, p, kCpu));
    const double keep = mask.to(at::kDouble).mean().item<double>();
    const double sigma = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(keep, 1 - p, 5 * sigma) << "p=" << p;
  }
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor u, PartitionedUniform({18, 0, 0}, {n}, {{0, n}}, kCpu));
  EXPECT_NEAR(u.mean().item<double>(), 0.5, 5 * std::sqrt(1.0 / 12 / n));
  EXPECT_GE(u.min().item<float>(), 0.0f);
  EXPECT_LT(u.max().item<float>(), 1.0f);
  // Dropout with p = 0 keeps everything.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor keep_all,
                                PartitionedDropoutMask({1, 0, 0}, {1000}, {{0, 1000}}, 0.0, kCpu));
  EXPECT_TRUE(keep_all.all().item<bool>());
}

TEST(PartitionInvarianceTest, BadBoxesAndProbabilitiesAreNamed) {
  const PhiloxKey key{1, 0, 0};
  EXPECT_THAT(PartitionedUniform(key, {4, 4}, {{0, 4}, {2, 5}}, kCpu).status().message(),
              HasSubstr("box [2, 5) of dimension 1 does not fit its size 4"));
  EXPECT_THAT(PartitionedUniform(key, {4, 4}, {{0, 4}}, kCpu).status().message(),
              HasSubstr("the box has 1 dimensions, the global shape 2"));
  EXPECT_THAT(PartitionedDropoutMask(key, {4}, {{0, 4}}, 1.0, kCpu).status().message(),
              HasSubstr("dropout probability 1 is outside [0, 1)"));
  EXPECT_EQ(PartitionedDropout(at::ones({3}), key, {4}, {{0, 4}}, 0.5).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A global tensor whose element indices would not fit 63 bits: refused, not wrapped.
  EXPECT_THAT(PartitionedUniform(key, {int64_t{1} << 32, int64_t{1} << 32}, {{0, 1}, {0, 1}}, kCpu)
                  .status()
                  .message(),
              HasSubstr("more than 2^63 - 1 elements"));
  LOCKSTEP_EXPECT_OK(
      PartitionedUniform(key, {int64_t{1} << 31, int64_t{1} << 31}, {{0, 1}, {0, 2}}, kCpu)
          .status());
  // A shard that wants a gradient would lose it: refused, unless grad mode is off.
  const at::Tensor wants_grad = at::ones({4}).requires_grad_();
  EXPECT_THAT(PartitionedDropout(wants_grad, key, {4}, {{0, 4}}, 0.5).status().message(),
              HasSubstr("records no gradient"));
  {
    at::AutoGradMode no_grad(/*enabled=*/false);
    LOCKSTEP_EXPECT_OK(PartitionedDropout(wants_grad, key, {4}, {{0, 4}}, 0.5).status());
  }
  EXPECT_THAT(PartitionedUniform(key, {4}, {{0, 4}}, c10::Device(c10::kMeta)).status().message(),
              HasSubstr("runs on CPU or CUDA, not meta"));
  if (!LOCKSTEP_BUILT_WITH_CUDA) {
    EXPECT_EQ(PartitionedUniform(key, {4}, {{0, 4}}, c10::Device(c10::kCUDA, 0)).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace rng
}  // namespace lockstep
