// numerics/digest: the definition (DIGEST.md) held against the Python reference bit for bit,
// invariance to registration order and layout, sensitivity to every bit, name, dtype and shape.

#include "numerics/digest.h"

#include <unistd.h>

#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/status_testutil.h"
#include "base/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "numerics/inventory.h"
#include "numerics/safetensors.h"

namespace lockstep {
namespace numerics {
namespace {

using ::testing::HasSubstr;

// Tensors spanning the chunk edge cases: empty, one byte, exactly one chunk, one chunk and a
// bit, several chunks, every dtype.
NamedTensors Assorted() {
  at::manual_seed(3);
  return {
      {"empty", at::empty({0, 5})},
      {"byte", at::full({1}, 7, at::kByte)},
      {"one_chunk", at::randn({4096})},                 // 16384 bytes
      {"chunk_and_a_bit", at::randn({4097})},           // 16388 bytes
      {"several", at::randn({3, 50000}, at::kDouble)},  // 1.2 MB
      {"bf16", at::randn({777}).to(at::kBFloat16)},
      {"f16", at::randn({5, 3}).to(at::kHalf)},
      {"i64", at::randint(-9, 9, {33}, at::kLong)},
      {"i32", at::randint(-9, 9, {33}, at::kInt)},
      {"i16", at::randint(-9, 9, {3}, at::kShort)},
      {"i8", at::randint(-9, 9, {3}, at::kChar)},
      {"flags", at::rand({9}).gt(0.5)},
      {"scalar", at::scalar_tensor(1.25)},
      {"layer.0.weight", at::randn({17, 19}).t()},  // non-contiguous
  };
}

TEST(DigestTest, MatchesThePythonReferenceBitForBit) {
  const NamedTensors tensors = Assorted();
  const std::string path = testing::TempDir() + "/assorted.safetensors";
  LOCKSTEP_ASSERT_OK(WriteSafetensors(path, tensors));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Inventory inventory, Inventory::Of(tensors));
  // The reference's stdout comes back through the channel and its stderr is this test's, as
  // with popen(..., "r"). argv is built before the fork: the child only redirects and execs.
  std::vector<std::string> args = {"/usr/bin/python3", "numerics/digest_reference.py", path};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Child reference_run,
                                Child::Fork(ChildOptions::Reporting(), [&argv](int channel) {
                                  dup2(channel, STDOUT_FILENO);
                                  execv(argv[0], argv.data());
                                  return 127;
                                }));
  std::string output;
  for (;;) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(
        const int open,
        PollChannels({&reference_run}, absl::Minutes(1), [&](size_t, absl::string_view bytes) {
          output.append(bytes.data(), bytes.size());
        }));
    if (open == 0) break;
  }
  reference_run.Reap();
  ASSERT_TRUE(reference_run.succeeded()) << reference_run.Describe() << ": " << output;
  const nlohmann::json reference = nlohmann::json::parse(output);
  EXPECT_EQ(reference["state_digest"], DigestHex128(inventory.state_digest()));
  ASSERT_EQ(reference["tensors"].size(), tensors.size());
  for (const InventoryEntry& entry : inventory.entries()) {
    EXPECT_EQ(reference["tensors"][entry.name], DigestHex128(entry.digest)) << entry.name;
  }
}

TEST(DigestTest, IndependentOfRegistrationOrderAndLayout) {
  NamedTensors tensors = Assorted();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Inventory forward, Inventory::Of(tensors));
  NamedTensors reversed(tensors.rbegin(), tensors.rend());
  for (auto& [name, tensor] : reversed) tensor = tensor.contiguous();  // another layout
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Inventory backward, Inventory::Of(reversed));
  EXPECT_EQ(forward.state_digest(), backward.state_digest());
  EXPECT_TRUE(CompareInventories(forward, backward).empty());
  // A channels-last copy and a strided slice of a larger tensor hash as their values.
  const at::Tensor image = at::randn({2, 3, 4, 5});
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Digest128 image_digest, DigestTensor(image));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Digest128 channels_last_digest,
                                DigestTensor(image.contiguous(at::MemoryFormat::ChannelsLast)));
  EXPECT_EQ(image_digest, channels_last_digest);
  const at::Tensor big = at::randn({10, 10});
  const at::Tensor slice = big.index({at::indexing::Slice(1, 9, 2), at::indexing::Slice(3, 7)});
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Digest128 slice_digest, DigestTensor(slice));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Digest128 clone_digest, DigestTensor(slice.clone()));
  EXPECT_EQ(slice_digest, clone_digest);
}

TEST(DigestTest, SensitiveToEveryBitAndToNamesDtypesAndShapes) {
  const at::Tensor base = at::randn({3, 8193});  // two chunks and a bit, 98316 bytes
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Digest128 original, DigestTensor(base));
  // One flipped bit in every 997th byte (first chunk, chunk edges, the padded tail).
  const int64_t bytes = base.numel() * 4;
  for (int64_t byte = 0; byte < bytes; byte += 997) {
    at::Tensor flipped = base.clone();
    static_cast<uint8_t*>(flipped.data_ptr())[byte] ^= 1u << (byte % 8);
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Digest128 flipped_digest, DigestTensor(flipped));
    EXPECT_NE(flipped_digest, original) << "byte " << byte;
  }
  at::Tensor last = base.clone();
  static_cast<uint8_t*>(last.data_ptr())[bytes - 1] ^= 0x80;
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Digest128 last_digest, DigestTensor(last));
  EXPECT_NE(last_digest, original);
  // Same bytes, other shape or dtype.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Digest128 reshaped, DigestTensor(base.reshape({8193, 3})));
  EXPECT_NE(reshaped, original);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Digest128 as_int, DigestTensor(base.view(at::kInt)));
  EXPECT_NE(as_int, original);
  // Zero-padding is not confusable with real zeros: a tensor and it with a zero appended.
  const at::Tensor short_one = at::ones({5}, at::kByte);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Digest128 short_digest, DigestTensor(short_one));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Digest128 padded_digest,
                                DigestTensor(at::cat({short_one, at::zeros({1}, at::kByte)})));
  EXPECT_NE(short_digest, padded_digest);
  // A renamed tensor changes the state digest, not the tensor digest.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Inventory a, Inventory::Of({{"w", base}}));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Inventory b, Inventory::Of({{"w2", base}}));
  EXPECT_NE(a.state_digest(), b.state_digest());
  EXPECT_EQ(a.entries()[0].digest, b.entries()[0].digest);
}

// The batched digests (Note [Batched digests]) are DigestTensor's, bit for bit, for a mix of
// empty, tiny, non-contiguous, offset, large (split within the tensor) and many small tensors.
TEST(DigestTest, DigestTensorsEqualsDigestTensorOfEach) {
  at::manual_seed(11);
  const at::Tensor bytes = at::randint(0, 255, {100001}, at::kByte);
  std::vector<at::Tensor> tensors = {
      at::randn({0}),
      at::randn({1}),
      at::randn({333, 77}).t(),
      bytes.narrow(0, 3, 50000),
      at::randn({64 << 20 >> 2}).to(at::kBFloat16),  // 32 MiB
      at::randn({(64 << 20 >> 2) + 5}),              // past the split threshold
      at::randint(0, 2, {4097}, at::kBool),
  };
  for (int i = 0; i < 300; ++i) tensors.push_back(at::randn({i % 7, 40}).to(at::kHalf));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::vector<Digest128> batched, DigestTensors(tensors));
  ASSERT_EQ(batched.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(Digest128 one, DigestTensor(tensors[i]));
    EXPECT_EQ(batched[i], one) << "tensor " << i;
  }
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::vector<Digest128> none, DigestTensors({}));
  EXPECT_TRUE(none.empty());
  EXPECT_THAT(DigestTensors({at::ones({1}), at::Tensor()}).status().message(),
              HasSubstr("tensor 1"));
  EXPECT_THAT(DigestTensors({at::ones({1}), at::empty({2}, at::TensorOptions().device(at::kMeta))})
                  .status()
                  .message(),
              HasSubstr("tensor 1 on meta"));
}

TEST(DigestTest, RefusesWhatItCannotDigest) {
  EXPECT_EQ(DigestTensor(at::Tensor()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(DigestTensor(at::ones({1}, at::kComplexFloat)).status().message(),
              HasSubstr("has no safetensors name"));
  EXPECT_THAT(StateDigest({{"a", {}}, {"a", {}}}).status().message(),
              HasSubstr("'a' appears twice"));
  EXPECT_EQ(DigestTensor(at::empty({2}, at::TensorOptions().device(at::kMeta))).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace numerics
}  // namespace lockstep
