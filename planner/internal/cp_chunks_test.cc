// planner/internal/cp_chunks: the chunk rule against an independent token-by-token oracle, and
// the per-rank counts (Note [Shard counts without pieces]) against the ranges.

#include "planner/internal/cp_chunks.h"

#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace lockstep {
namespace planner {
namespace internal {
namespace {

// Owner rank of every token of a microbatch, computed the slow way: each sequence's chunk sizes
// from the rule's text (base tokens each, leftovers one per slot in the order F(0), B(0), F(1),
// B(1), ..., continuing across sequences).
std::vector<int> OwnerOfEachToken(const std::vector<int64_t>& lengths, int cp) {
  const int chunks = 2 * cp;
  std::vector<int> slot_chunk;  // slot s -> chunk index
  for (int r = 0; r < cp; ++r) {
    slot_chunk.push_back(r);
    slot_chunk.push_back(chunks - 1 - r);
  }
  std::vector<int> owner;
  int next_slot = 0;
  for (int64_t n : lengths) {
    std::vector<int64_t> size(chunks, n / chunks);
    for (int64_t i = 0; i < n % chunks; ++i) {
      ++size[slot_chunk[next_slot]];
      next_slot = (next_slot + 1) % chunks;
    }
    for (int j = 0; j < chunks; ++j) {
      const int rank = j < cp ? j : chunks - 1 - j;
      for (int64_t t = 0; t < size[j]; ++t) owner.push_back(rank);
    }
  }
  return owner;
}

TEST(CpChunksTest, ChunkSlotsFollowTheMirroredPairOrder) {
  // cp = 3: chunks 0..5, slots F(0)=0, B(0)=5, F(1)=1, B(1)=4, F(2)=2, B(2)=3.
  const std::vector<int> expected = {0, 2, 4, 5, 3, 1};  // slot of chunk j
  for (int j = 0; j < 6; ++j) EXPECT_EQ(ChunkSlot(j, 3), expected[j]) << "chunk " << j;
}

TEST(CpChunksTest, RangesAndCountsMatchTheOracleOnRandomMicrobatches) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int cp = 1 + static_cast<int>(rng() % 8);
    const int n = 1 + static_cast<int>(rng() % 6);
    std::vector<int64_t> lengths, cu = {0};
    for (int k = 0; k < n; ++k) {
      lengths.push_back(1 + static_cast<int64_t>(rng() % (trial % 2 == 0 ? 5 * cp : 200)));
      cu.push_back(cu.back() + lengths.back());
    }
    const std::vector<int> owner = OwnerOfEachToken(lengths, cp);
    std::vector<int64_t> scratch;
    ShardCounts counts(cp, scratch);
    for (int64_t length : lengths) counts.AddSequence(length);
    std::vector<int> covered(owner.size(), -1);
    for (int rank = 0; rank < cp; ++rank) {
      int64_t tokens = 0;
      int32_t pieces = 0;
      int64_t last_end = -1;
      RankPieces(cu.data(), n, cp, rank, [&](int k, int j, int64_t begin, int64_t end) {
        ASSERT_LT(begin, end);
        ASSERT_GE(begin, cu[k]);
        ASSERT_LE(end, cu[k + 1]);
        ASSERT_GT(begin, last_end - 1) << "pieces out of order";
        ASSERT_TRUE(j == rank || j == 2 * cp - 1 - rank);
        last_end = end;
        for (int64_t t = begin; t < end; ++t) covered[t] = rank;
        tokens += end - begin;
        ++pieces;
      });
      EXPECT_EQ(counts.tokens(rank), tokens) << "cp " << cp << " rank " << rank;
      EXPECT_EQ(counts.pieces(rank), pieces) << "cp " << cp << " rank " << rank;
    }
    ASSERT_EQ(covered, owner) << "trial " << trial << ", cp " << cp;
  }
}

}  // namespace
}  // namespace internal
}  // namespace planner
}  // namespace lockstep
