// The host version of the device kernel's XXH3-128 for 16 KiB chunks equals libxxhash's.

#include "numerics/internal/xxh3_chunk.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "xxhash.h"

namespace lockstep {
namespace numerics {
namespace internal {
namespace {

TEST(Xxh3ChunkTest, EqualsLibxxhashOnRandomAndSpecialChunks) {
  static constexpr uint8_t kSecret[kXxh3SecretBytes] = {LOCKSTEP_XXH3_SECRET_BYTES};
  std::mt19937_64 random(7);
  std::vector<uint8_t> chunk(kXxh3ChunkBytes);
  for (int trial = 0; trial < 40; ++trial) {
    if (trial == 0) {
      std::fill(chunk.begin(), chunk.end(), 0);
    } else if (trial == 1) {
      std::fill(chunk.begin(), chunk.end(), 0xff);
    } else {
      for (uint8_t& b : chunk) b = static_cast<uint8_t>(random());
    }
    uint8_t mine[16];
    Xxh3Chunk(chunk.data(), kSecret, mine);
    XXH128_canonical_t theirs;
    XXH128_canonicalFromHash(&theirs, XXH3_128bits(chunk.data(), chunk.size()));
    ASSERT_EQ(std::memcmp(mine, theirs.digest, 16), 0) << "trial " << trial;
  }
  // A one-bit change anywhere changes the hash (the test can fail).
  uint8_t before[16], after[16];
  Xxh3Chunk(chunk.data(), kSecret, before);
  chunk[12345] ^= 0x10;
  Xxh3Chunk(chunk.data(), kSecret, after);
  EXPECT_NE(std::memcmp(before, after, 16), 0);
}

}  // namespace
}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
