// planner/internal/cp_chunks.h
//
// Private to planner/: the arithmetic of the CP chunk rule CP_CHUNK_MIRRORED_PAIRS_V1
// (plan.proto, planner.h): which packed-buffer ranges each CP rank owns, and how many tokens and
// pieces that makes per rank without listing the ranges.
//
// Under the rule a packed sequence of n tokens is cut into 2cp chunks of n / (2cp) tokens; its
// n % (2cp) leftover tokens lengthen chunks by one each, in the slot order F(0), B(0), F(1),
// B(1), ... (F(r): rank r's front chunk r, B(r): its back chunk 2cp-1-r), continuing from
// sequence to sequence and starting at slot 0 with the microbatch.
//
// Note [Shard counts without pieces]
// So the leftover slots of a whole microbatch are its first E = sum(n % (2cp)) slots of that
// cycle: slot s gets E / (2cp) + (s < E % (2cp)) of them, and rank r (slots 2r, 2r+1) owns
// 2 * sum(base) + those of its two slots, tokens. A sequence with base > 0 gives every rank two
// pieces; one with base 0 (n < 2cp) gives a one-token piece to each of its n leftover slots.
// That is O(sequences + cp) per microbatch; RankPieces derives the ranges chunk by chunk, and
// VerifyPlan checks that the two agree.
//
// Thread-safety: stateless functions; a ShardCounts is used by one thread.

#ifndef LOCKSTEP_PLANNER_INTERNAL_CP_CHUNKS_H_
#define LOCKSTEP_PLANNER_INTERNAL_CP_CHUNKS_H_

#include <cstdint>
#include <vector>

namespace lockstep {
namespace planner {
namespace internal {

// The slot of chunk j of 2cp in the leftover order. Precondition: 0 <= j < 2cp.
inline int ChunkSlot(int j, int cp) { return j < cp ? 2 * j : 4 * cp - 1 - 2 * j; }

// Accumulates, sequence by sequence, how many tokens and pieces each of `cp` ranks owns of one
// microbatch (Note [Shard counts without pieces]). `scratch` is reused across microbatches.
class ShardCounts {
 public:
  ShardCounts(int cp, std::vector<int64_t>& scratch) : cp_(cp), short_pieces_(scratch) {
    short_pieces_.assign(cp, 0);
  }

  // Adds the next packed sequence, of `num_tokens` >= 1 tokens.
  void AddSequence(int64_t num_tokens) {
    const int chunks = 2 * cp_;
    const int64_t base = num_tokens / chunks;
    const int remainder = static_cast<int>(num_tokens - base * chunks);
    if (base > 0) {
      base_sum_ += base;
      ++long_sequences_;
    } else {
      const int turn = static_cast<int>(leftovers_ % chunks);
      for (int i = 0; i < remainder; ++i) ++short_pieces_[((turn + i) % chunks) / 2];
    }
    leftovers_ += remainder;
  }

  // Tokens and pieces rank `rank` owns of the sequences added so far.
  int64_t tokens(int rank) const {
    const int chunks = 2 * cp_;
    const int64_t rounds = leftovers_ / chunks;
    const int64_t partial = leftovers_ % chunks;
    const int64_t extra =
        2 * rounds + (2 * rank < partial ? 1 : 0) + (2 * rank + 1 < partial ? 1 : 0);
    return 2 * base_sum_ + extra;
  }
  int32_t pieces(int rank) const {
    return static_cast<int32_t>(2 * long_sequences_ + short_pieces_[rank]);
  }

 private:
  int cp_;
  std::vector<int64_t>& short_pieces_;  // per rank, from sequences shorter than 2cp
  int64_t base_sum_ = 0;
  int64_t long_sequences_ = 0;
  int64_t leftovers_ = 0;
};

// Calls emit(sequence, chunk, begin, end) for every non-empty range rank `rank` owns of the
// packed sequences with boundaries cu[0 .. n] (strictly increasing), ordered by sequence, then
// chunk. Precondition: 0 <= rank < cp.
template <typename Emit>
void RankPieces(const int64_t* cu, int n, int cp, int rank, const Emit& emit) {
  const int chunks = 2 * cp;
  const int back = chunks - 1 - rank;
  int turn = 0;  // the leftover slot that comes next
  for (int k = 0; k < n; ++k) {
    const int64_t length = cu[k + 1] - cu[k];
    const int64_t base = length / chunks;
    const int remainder = static_cast<int>(length % chunks);
    int64_t begin = cu[k];
    for (int j = 0; j <= back; ++j) {
      const int64_t size = base + ((ChunkSlot(j, cp) - turn + chunks) % chunks < remainder ? 1 : 0);
      if ((j == rank || j == back) && size > 0) emit(k, j, begin, begin + size);
      begin += size;
    }
    turn = (turn + remainder) % chunks;
  }
}

}  // namespace internal
}  // namespace planner
}  // namespace lockstep

#endif  // LOCKSTEP_PLANNER_INTERNAL_CP_CHUNKS_H_
