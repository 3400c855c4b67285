// Example-based tests of the planner: packing policies and their tie-breaking, CP sharding
// (chunk layout, leftovers, tiny sequences, empty ownership), positions and boundaries, loss
// normalisation, re-planning, determinism, and every bad-input error.

#include "planner/planner.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/plan_check.h"
#include "planner/planner_testutil.h"

namespace lockstep {
namespace planner {
namespace {

using ::testing::DoubleEq;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<Sequence> Lengths(std::vector<int64_t> lengths) {
  std::vector<Sequence> batch;
  for (size_t i = 0; i < lengths.size(); ++i) {
    batch.push_back(Sequence::Of(lengths[i], 100 + static_cast<int64_t>(i)));
  }
  return batch;
}

std::vector<int32_t> Indices(const Microbatch& mb) {
  return std::vector<int32_t>(mb.batch_index().begin(), mb.batch_index().end());
}

// (begin, end, chunk) of every piece of `rank`'s shard of microbatch `m`, as ShardPieces
// derives them; also checks them against the shard's stored counts.
std::vector<std::vector<int64_t>> Pieces(const Plan& plan, int m, int rank) {
  std::vector<std::vector<int64_t>> out;
  absl::StatusOr<std::vector<ShardPiece>> pieces = ShardPieces(plan, m, rank);
  EXPECT_TRUE(pieces.ok()) << pieces.status();
  if (!pieces.ok()) return out;
  int64_t tokens = 0;
  for (const ShardPiece& p : *pieces) {
    out.push_back({p.begin, p.end, p.chunk});
    tokens += p.end - p.begin;
  }
  const Microbatch& mb = plan.microbatches(m);
  EXPECT_EQ(mb.shard_cp_rank(rank), rank);
  EXPECT_EQ(mb.shard_num_tokens(rank), tokens) << "microbatch " << m << " rank " << rank;
  EXPECT_EQ(mb.shard_num_pieces(rank), static_cast<int>(out.size())) << "microbatch " << m;
  return out;
}

std::vector<int64_t> Indices(const Plan& plan, int m, int rank) {
  absl::StatusOr<std::vector<int64_t>> indices = ShardTokenIndices(plan, m, rank);
  EXPECT_TRUE(indices.ok()) << indices.status();
  return indices.ok() ? *indices : std::vector<int64_t>{};
}

Plan MustPlan(const std::vector<Sequence>& batch, const PlanOptions& options) {
  absl::StatusOr<Plan> plan = PlanMicrobatches(batch, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return Plan();
  EXPECT_TRUE(VerifyPlan(*plan, batch).ok()) << VerifyPlan(*plan, batch);
  return *std::move(plan);
}

TEST(PackingTest, FirstFitDecreasingPlacesLongestFirst) {
  // In order: [6] [5 4] [3 2] = 3 microbatches; FFD: [6 4] [5 3 2] = 2.
  Plan plan = MustPlan(Lengths({6, 5, 4, 3, 2}), PlanOptions::Of(10));
  EXPECT_EQ(plan.packing_applied(), PACKING_FIRST_FIT_DECREASING);
  ASSERT_EQ(plan.microbatches_size(), 2);
  EXPECT_THAT(Indices(plan.microbatches(0)), ElementsAre(0, 2));
  EXPECT_THAT(Indices(plan.microbatches(1)), ElementsAre(1, 3, 4));
}

TEST(PackingTest, EqualLengthsKeepInputOrder) {
  Plan plan = MustPlan(Lengths({5, 7, 5, 5, 7}), PlanOptions::Of(12));
  ASSERT_EQ(plan.microbatches_size(), 3);
  EXPECT_THAT(Indices(plan.microbatches(0)), ElementsAre(1, 0));
  EXPECT_THAT(Indices(plan.microbatches(1)), ElementsAre(4, 2));
  EXPECT_THAT(Indices(plan.microbatches(2)), ElementsAre(3));
}

TEST(PackingTest, DefaultFallsBackToInOrderWhenThatNeedsFewerMicrobatches) {
  // FFD: [4 4] [3 3 3] [3] = 3 microbatches; in order: [4 3 3] [4 3 3] = 2.
  Plan plan = MustPlan(Lengths({4, 3, 3, 4, 3, 3}), PlanOptions::Of(10));
  EXPECT_EQ(plan.limits().packing(), PACKING_FIRST_FIT_DECREASING);
  EXPECT_EQ(plan.packing_applied(), PACKING_IN_ORDER);
  ASSERT_EQ(plan.microbatches_size(), 2);
  EXPECT_THAT(Indices(plan.microbatches(0)), ElementsAre(0, 1, 2));
  EXPECT_THAT(Indices(plan.microbatches(1)), ElementsAre(3, 4, 5));
}

TEST(PackingTest, InOrderPolicyNeverReorders) {
  Plan plan = MustPlan(Lengths({6, 5, 4, 3, 2}), InOrder(10));
  EXPECT_EQ(plan.packing_applied(), PACKING_IN_ORDER);
  ASSERT_EQ(plan.microbatches_size(), 3);
  EXPECT_THAT(Indices(plan.microbatches(0)), ElementsAre(0));
  EXPECT_THAT(Indices(plan.microbatches(1)), ElementsAre(1, 2));
  EXPECT_THAT(Indices(plan.microbatches(2)), ElementsAre(3, 4));
}

TEST(PackingTest, HugeLengthsUseRankedBuckets) {
  // Lengths above the direct-indexing bound take the sorted-distinct-lengths path.
  const int64_t g = int64_t{1} << 30;
  Plan plan = MustPlan(Lengths({3 * g, g, 2 * g, g, 5}), PlanOptions::Of(4 * g));
  ASSERT_EQ(plan.microbatches_size(), 2);
  EXPECT_THAT(Indices(plan.microbatches(0)), ElementsAre(0, 1));
  EXPECT_THAT(Indices(plan.microbatches(1)), ElementsAre(2, 3, 4));
}

TEST(BoundariesTest, OffsetsPositionsAndCuSeqlens) {
  Plan plan = MustPlan(Lengths({3, 2, 4}), InOrder(16));
  ASSERT_EQ(plan.microbatches_size(), 1);
  const Microbatch& mb = plan.microbatches(0);
  EXPECT_EQ(mb.num_tokens(), 9);
  EXPECT_THAT(mb.cu_seqlens(), ElementsAre(0, 3, 5, 9));
  EXPECT_THAT(mb.sequence_id(), ElementsAre(100, 101, 102));
  // Compact forms: nothing split, so no token begins; one loss scale shared by all.
  EXPECT_THAT(mb.token_begin(), ElementsAre());
  EXPECT_THAT(mb.loss_scale(), ElementsAre(DoubleEq(1.0 / 9)));
  EXPECT_EQ(TokenBegin(mb, 2), 0);
  EXPECT_THAT(LossScale(mb, 2), DoubleEq(1.0 / 9));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const std::vector<int64_t> positions, PositionIds(mb));
  EXPECT_THAT(positions, ElementsAre(0, 1, 2, 0, 1, 0, 1, 2, 3));
}

TEST(CpShardTest, RankOwnsChunksIAnd2CpMinus1MinusI) {
  Plan plan = MustPlan(Lengths({8}), PlanOptions::Of(8, 2));
  EXPECT_EQ(plan.cp_chunk_rule(), CP_CHUNK_MIRRORED_PAIRS_V1);
  using P = std::vector<int64_t>;
  EXPECT_THAT(Pieces(plan, 0, 0), ElementsAre(P{0, 2, 0}, P{6, 8, 3}));
  EXPECT_THAT(Pieces(plan, 0, 1), ElementsAre(P{2, 4, 1}, P{4, 6, 2}));
  EXPECT_THAT(Indices(plan, 0, 0), ElementsAre(0, 1, 6, 7));
  EXPECT_THAT(Indices(plan, 0, 1), ElementsAre(2, 3, 4, 5));
}

TEST(CpShardTest, LeftoverTokensGoInMirroredPairsTakingTurns) {
  // Three sequences of 9 tokens, CP 2: 9 = 4 chunks x 2 + 1 leftover. Leftover slots in order:
  // rank 0 front (chunk 0), rank 0 back (chunk 3), rank 1 front (chunk 1), ...
  Plan plan = MustPlan(Lengths({9, 9, 9}), PlanOptions::Of(32, 2));
  const Microbatch& mb = plan.microbatches(0);
  using P = std::vector<int64_t>;
  EXPECT_THAT(Pieces(plan, 0, 0), ElementsAre(P{0, 3, 0}, P{7, 9, 3}, P{9, 11, 0}, P{15, 18, 3},
                                              P{18, 20, 0}, P{25, 27, 3}));
  EXPECT_THAT(Pieces(plan, 0, 1), ElementsAre(P{3, 5, 1}, P{5, 7, 2}, P{11, 13, 1}, P{13, 15, 2},
                                              P{20, 23, 1}, P{23, 25, 2}));
  EXPECT_THAT(mb.shard_num_tokens(), ElementsAre(14, 13));
  EXPECT_THAT(mb.shard_num_pieces(), ElementsAre(6, 6));
}

TEST(CpShardTest, TinySequencesSpreadOverRanks) {
  // Sequences shorter than 2 x CP: chunks of 0 or 1 token; the leftover slots continue across
  // sequences: F0 | B0 | F1 B1 F2 | B2 F3 (Fr: rank r's front chunk r, Br: its back chunk 7 - r).
  Plan plan = MustPlan(Lengths({1, 1, 3, 2}), InOrder(64, 4));
  using P = std::vector<int64_t>;
  EXPECT_THAT(Pieces(plan, 0, 0), ElementsAre(P{0, 1, 0}, P{1, 2, 7}));
  EXPECT_THAT(Pieces(plan, 0, 1), ElementsAre(P{2, 3, 1}, P{4, 5, 6}));
  EXPECT_THAT(Pieces(plan, 0, 2), ElementsAre(P{3, 4, 2}, P{6, 7, 5}));
  EXPECT_THAT(Pieces(plan, 0, 3), ElementsAre(P{5, 6, 3}));
}

TEST(CpShardTest, RankWithNothingHasAnExplicitEmptyShard) {
  // 3 tokens, CP 4: rank 0 takes chunks 0 and 7, rank 1 chunk 1; ranks 2 and 3 own nothing.
  Plan plan = MustPlan(Lengths({3}), PlanOptions::Of(8, 4));
  const Microbatch& mb = plan.microbatches(0);
  EXPECT_THAT(mb.shard_cp_rank(), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(mb.shard_num_tokens(), ElementsAre(2, 1, 0, 0));
  EXPECT_THAT(mb.shard_num_pieces(), ElementsAre(2, 1, 0, 0));
  using P = std::vector<int64_t>;
  EXPECT_THAT(Pieces(plan, 0, 0), ElementsAre(P{0, 1, 0}, P{2, 3, 7}));
  EXPECT_THAT(Pieces(plan, 0, 1), ElementsAre(P{1, 2, 1}));
  for (int r : {2, 3}) {
    EXPECT_TRUE(Pieces(plan, 0, r).empty());
    EXPECT_TRUE(Indices(plan, 0, r).empty());
  }
}

TEST(CpShardTest, OneTokenSequenceWithLargeCp) {
  Plan plan = MustPlan(Lengths({1}), PlanOptions::Of(16, 8));
  const Microbatch& mb = plan.microbatches(0);
  EXPECT_THAT(mb.shard_cp_rank(), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_THAT(mb.shard_num_tokens(), ElementsAre(1, 0, 0, 0, 0, 0, 0, 0));
  EXPECT_THAT(mb.shard_num_pieces(), ElementsAre(1, 0, 0, 0, 0, 0, 0, 0));
}

TEST(CpShardTest, ShardPiecesRefusesBadArguments) {
  Plan plan = MustPlan(Lengths({9, 5}), PlanOptions::Of(16, 2));
  auto code_and_message = [&](const Plan& p, int m, int r) {
    absl::Status status = ShardPieces(p, m, r).status();
    EXPECT_EQ(ShardTokenIndices(p, m, r).status(), status);
    return status;
  };
  absl::Status s = code_and_message(plan, 1, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("microbatch 1 is not in the plan, which has 1"));
  s = code_and_message(plan, 0, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("CP rank 2 is not in [0, 2)"));
  EXPECT_EQ(code_and_message(plan, 0, -1).code(), absl::StatusCode::kInvalidArgument);
  Plan broken = plan;
  broken.mutable_microbatches(0)->set_cu_seqlens(1, 14);
  s = code_and_message(broken, 0, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not strictly increasing at 2 (14 then 14)"));
  Plan unknown = plan;
  unknown.set_cp_chunk_rule(static_cast<CpChunkRule>(7));
  s = code_and_message(unknown, 0, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("CP chunk rule is 7"));
  EXPECT_EQ(SplitMicrobatch(unknown, 0).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CpShardTest, StoredCountsMatchDerivedPiecesForManyShapes) {
  // Mixed long and short sequences, CP 1 to 8: the counts PlanMicrobatches computes without
  // pieces (Note [Shard counts without pieces]) equal what ShardPieces derives (Pieces checks).
  for (int cp : {1, 2, 3, 4, 8}) {
    std::vector<int64_t> lengths;
    for (int64_t i = 1; i <= 40; ++i) lengths.push_back((i * 37) % 53 + 1);
    const std::vector<Sequence> batch = Lengths(lengths);
    Plan plan = MustPlan(batch, PlanOptions::Of(200, cp));
    for (int m = 0; m < plan.microbatches_size(); ++m) {
      for (int r = 0; r < cp; ++r) Pieces(plan, m, r);
    }
  }
}

// Weights of every packed token, over the whole plan, by (batch index, token).
absl::StatusOr<std::vector<std::vector<double>>> WeightsByToken(
    const Plan& plan, const std::vector<Sequence>& batch) {
  std::vector<std::vector<double>> w(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) w[i].assign(batch[i].num_tokens, 0.0);
  for (const Microbatch& mb : plan.microbatches()) {
    absl::StatusOr<std::vector<double>> tw = TokenLossWeights(mb, batch);
    if (!tw.ok()) return tw.status();
    absl::StatusOr<std::vector<int64_t>> pos = PositionIds(mb);
    if (!pos.ok()) return pos.status();
    for (int k = 0; k < mb.batch_index_size(); ++k) {
      for (int64_t t = mb.cu_seqlens(k); t < mb.cu_seqlens(k + 1); ++t) {
        w[mb.batch_index(k)][(*pos)[t]] += (*tw)[t];
      }
    }
  }
  return w;
}

TEST(LossTest, NormalisationsGiveTheDocumentedWeights) {
  std::vector<Sequence> batch = Lengths({2, 3});
  batch[1].loss_weights = {0.0f, 1.0f, 3.0f};  // weight total: 2 + 4 = 6
  auto weights = [&](LossNormalization norm) {
    return WeightsByToken(MustPlan(batch, Normalized(4, norm)), batch);
  };
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto mean, weights(LOSS_TOKEN_MEAN));
  EXPECT_THAT(mean[0], ElementsAre(DoubleEq(1.0 / 6), DoubleEq(1.0 / 6)));
  EXPECT_THAT(mean[1], ElementsAre(DoubleEq(0.0), DoubleEq(1.0 / 6), DoubleEq(3.0 / 6)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto sum, weights(LOSS_SUM));
  EXPECT_THAT(sum[0], ElementsAre(DoubleEq(1.0), DoubleEq(1.0)));
  EXPECT_THAT(sum[1], ElementsAre(DoubleEq(0.0), DoubleEq(1.0), DoubleEq(3.0)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto per_sequence, weights(LOSS_SEQUENCE_MEAN));
  EXPECT_THAT(per_sequence[0], ElementsAre(DoubleEq(0.25), DoubleEq(0.25)));
  EXPECT_THAT(per_sequence[1], ElementsAre(DoubleEq(0.0), DoubleEq(1.0 / 8), DoubleEq(3.0 / 8)));
}

TEST(LossTest, LossScaleIsStoredOncePerMicrobatchUnlessItDiffers) {
  const PlanOptions per_sequence = Normalized(8, LOSS_SEQUENCE_MEAN);
  // Longest first: sequence 1 (3 tokens), then sequence 0 (2 tokens).
  Plan plan = MustPlan(Lengths({2, 3}), per_sequence);
  ASSERT_EQ(plan.microbatches_size(), 1);
  const Microbatch& mb = plan.microbatches(0);
  EXPECT_THAT(mb.loss_scale(), ElementsAre(DoubleEq(1.0 / 6), DoubleEq(1.0 / 4)));
  EXPECT_THAT(LossScale(mb, 1), DoubleEq(1.0 / 4));
  // Equal per-sequence scales collapse to one entry.
  Plan equal = MustPlan(Lengths({3, 3}), per_sequence);
  EXPECT_THAT(equal.microbatches(0).loss_scale(), ElementsAre(DoubleEq(1.0 / 6)));
  EXPECT_THAT(LossScale(equal.microbatches(0), 1), DoubleEq(1.0 / 6));
}

TEST(LossTest, TokenLossWeightsRefusesAnotherBatch) {
  std::vector<Sequence> batch = Lengths({2, 3});
  Plan plan = MustPlan(batch, PlanOptions::Of(8));
  std::vector<Sequence> other = batch;
  other[1].id = 7;
  absl::StatusOr<std::vector<double>> w = TokenLossWeights(plan.microbatches(0), other);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(), HasSubstr("id 7"));
}

TEST(LossTest, WriteTokenLossWeightsFillsTheCallersRoomOrWritesNothing) {
  std::vector<Sequence> batch = Lengths({2, 3});
  batch[1].loss_weights = {0.0f, 1.0f, 3.0f};
  const Plan plan = MustPlan(batch, Normalized(8, LOSS_TOKEN_MEAN));
  const Microbatch& mb = plan.microbatches(0);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const std::vector<double> listed, TokenLossWeights(mb, batch));
  std::vector<double> room(listed.size(), -1.0);
  LOCKSTEP_ASSERT_OK(WriteTokenLossWeights(mb, batch, absl::MakeSpan(room)));
  EXPECT_EQ(room, listed);
  // Room of another size, or another batch: refused, and the room untouched.
  std::vector<double> short_room(listed.size() - 1, -1.0);
  const absl::Status too_short = WriteTokenLossWeights(mb, batch, absl::MakeSpan(short_room));
  EXPECT_EQ(too_short.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_short.message(), HasSubstr("room for 4 tokens, the microbatch has 5"));
  EXPECT_THAT(short_room, Each(-1.0));
  std::vector<Sequence> other = batch;
  other[0].id = 9;
  std::fill(room.begin(), room.end(), -1.0);
  EXPECT_EQ(WriteTokenLossWeights(mb, other, absl::MakeSpan(room)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(room, Each(-1.0));
}

TEST(SplitTest, SplitsAtTheSequenceBoundaryNearestHalf) {
  std::vector<Sequence> batch = Lengths({4, 2, 3, 5});
  Plan plan = MustPlan(batch, InOrder(14));
  ASSERT_EQ(plan.microbatches_size(), 1);
  absl::StatusOr<Plan> split = SplitMicrobatch(plan, 0);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_TRUE(VerifyPlan(*split, batch).ok()) << VerifyPlan(*split, batch);
  EXPECT_EQ(split->splits(), 1);
  ASSERT_EQ(split->microbatches_size(), 2);
  // Boundaries at 4, 6, 9 of 14 tokens: 6 is nearest to 7.
  EXPECT_THAT(Indices(split->microbatches(0)), ElementsAre(0, 1));
  EXPECT_THAT(Indices(split->microbatches(1)), ElementsAre(2, 3));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const auto split_weights, WeightsByToken(*split, batch));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const auto plan_weights, WeightsByToken(plan, batch));
  EXPECT_EQ(split_weights, plan_weights);
}

TEST(SplitTest, SplitsOneSequenceAtACpCompatibleCut) {
  std::vector<Sequence> batch = Lengths({21});
  batch[0].loss_weights.assign(21, 0.5f);
  batch[0].loss_weights[20] = 2.0f;
  Plan plan = MustPlan(batch, PlanOptions::Of(32, 2));
  absl::StatusOr<Plan> split = SplitMicrobatch(plan, 0);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_TRUE(VerifyPlan(*split, batch).ok()) << VerifyPlan(*split, batch);
  ASSERT_EQ(split->microbatches_size(), 2);
  // 21 / 2 = 10, rounded down to a multiple of 2 x CP = 4: 8.
  EXPECT_EQ(split->microbatches(0).num_tokens(), 8);
  EXPECT_THAT(split->microbatches(0).token_begin(), ElementsAre());
  EXPECT_THAT(split->microbatches(1).token_begin(), ElementsAre(8));
  EXPECT_EQ(TokenBegin(split->microbatches(1), 0), 8);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const std::vector<int64_t> positions,
                                PositionIds(split->microbatches(1)));
  EXPECT_EQ(positions.front(), 8);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const auto split_weights, WeightsByToken(*split, batch));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const auto plan_weights, WeightsByToken(plan, batch));
  EXPECT_EQ(split_weights, plan_weights);
}

TEST(SplitTest, KeepsOtherMicrobatchesAndOrder) {
  std::vector<Sequence> batch = Lengths({6, 6, 6, 6});
  Plan plan = MustPlan(batch, PlanOptions::Of(12));
  ASSERT_EQ(plan.microbatches_size(), 2);
  absl::StatusOr<Plan> split = SplitMicrobatch(plan, 0);
  ASSERT_TRUE(split.ok());
  ASSERT_EQ(split->microbatches_size(), 3);
  EXPECT_THAT(Indices(split->microbatches(0)), ElementsAre(0));
  EXPECT_THAT(Indices(split->microbatches(1)), ElementsAre(1));
  EXPECT_EQ(split->microbatches(2).SerializeAsString(), plan.microbatches(1).SerializeAsString());
}

TEST(SplitTest, RefusesWhatCannotBeSplit) {
  std::vector<Sequence> batch = Lengths({4});
  Plan plan = MustPlan(batch, PlanOptions::Of(8, 2));
  absl::StatusOr<Plan> split = SplitMicrobatch(plan, 0);
  EXPECT_EQ(split.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(split.status().message(), HasSubstr("only 4 tokens of sequence 0 (id 100)"));
  EXPECT_THAT(split.status().message(), HasSubstr("2 x cp_size = 4"));
  EXPECT_EQ(SplitMicrobatch(plan, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitMicrobatch(plan, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SplitTest, RefusesMalformedBoundariesInsteadOfWritingOutOfRange) {
  Plan plan = MustPlan(Lengths({40, 60}), PlanOptions::Of(100, 2));
  ASSERT_EQ(plan.microbatches_size(), 1);
  Plan tampered = plan;
  tampered.mutable_microbatches(0)->set_cu_seqlens(1, -3);  // [0, -3, 100]
  absl::StatusOr<Plan> split = SplitMicrobatch(tampered, 0);
  EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument) << split.status();
  EXPECT_THAT(split.status().message(), HasSubstr("not strictly increasing"));
  EXPECT_TRUE(SplitMicrobatch(plan, 0).ok());  // the untampered plan splits
}

// Found by //planner:plan_check_fuzzer: a received plan claiming INT32_MAX splits overflowed the
// split count.
TEST(SplitTest, RefusesASplitCountOutsideThePlan) {
  Plan plan = MustPlan(Lengths({40, 60}), PlanOptions::Of(100, 2));
  for (int32_t splits : {-1, 1, std::numeric_limits<int32_t>::max()}) {
    Plan tampered = plan;
    tampered.set_splits(splits);
    absl::StatusOr<Plan> split = SplitMicrobatch(tampered, 0);
    EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument) << splits;
    EXPECT_THAT(split.status().message(), HasSubstr(absl::StrCat("split ", splits, " times")));
  }
  EXPECT_EQ(SplitMicrobatch(plan, 0)->splits(), 1);
}

TEST(SplitTest, RefusesATokenBeginWhoseSecondHalfWouldOverflow) {
  Plan plan = MustPlan(Lengths({100}), PlanOptions::Of(100, 2));
  ASSERT_EQ(plan.microbatches_size(), 1);
  Plan tampered = plan;
  tampered.mutable_microbatches(0)->add_token_begin(std::numeric_limits<int64_t>::max() - 10);
  absl::StatusOr<Plan> split = SplitMicrobatch(tampered, 0);
  EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument) << split.status();
  EXPECT_THAT(split.status().message(), HasSubstr("holds 100 tokens"));
}

// A budget meaning "no limit" must not overflow the in-order count (which would silently turn
// the default into in-order packing).
TEST(PackingTest, HugeBudgetStillPacksFirstFitDecreasing) {
  Plan plan = MustPlan(Lengths({2, 9, 4}), PlanOptions::Of(std::numeric_limits<int64_t>::max()));
  EXPECT_EQ(plan.packing_applied(), PACKING_FIRST_FIT_DECREASING);
  ASSERT_EQ(plan.microbatches_size(), 1);
  EXPECT_THAT(Indices(plan.microbatches(0)), ElementsAre(1, 2, 0));
}

// The largest budget with the largest CP size and 2^63 - 1 tokens: no overflow in
// the in-order count, the chunk arithmetic or the shard counts, and VerifyPlan agrees.
TEST(PackingTest, HugeBudgetHugeSequencesAndLargestCp) {
  const int64_t big = int64_t{1} << 62;
  // INT64_MAX tokens in all: the most a plan can count.
  const std::vector<Sequence> batch = Lengths({big, 3, big - 4});
  const Plan plan =
      MustPlan(batch, PlanOptions::Of(std::numeric_limits<int64_t>::max(), kMaxCpSize));
  ASSERT_EQ(plan.microbatches_size(), 1);
  EXPECT_THAT(Indices(plan.microbatches(0)), ElementsAre(0, 2, 1));
  EXPECT_TRUE(VerifyPlan(plan, batch).ok()) << VerifyPlan(plan, batch);
  EXPECT_EQ(plan.microbatches(0).num_tokens(), std::numeric_limits<int64_t>::max());
  for (const Microbatch& mb : plan.microbatches()) {
    int64_t tokens = 0;
    for (int64_t t : mb.shard_num_tokens()) tokens += t;
    EXPECT_EQ(tokens, mb.num_tokens());
  }
  // Listing the tokens of such a microbatch is refused, not attempted.
  const absl::Status listed = ShardTokenIndices(plan, 0, 0).status();
  EXPECT_EQ(listed.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(listed.message(), HasSubstr("the limit is 2147483648"));
  EXPECT_EQ(PositionIds(plan.microbatches(0)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(TokenLossWeights(plan.microbatches(0), batch).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// The token-listing functions take plans from anywhere: impossible values get a status, never an
// abort, an overflow or an allocation the size of the claim.
TEST(UnverifiedPlanTest, TokenListsRefuseImpossibleMicrobatches) {
  const std::vector<Sequence> batch = Lengths({5, 3});
  const Plan plan = MustPlan(batch, PlanOptions::Of(8, 2));
  const Microbatch& good = plan.microbatches(0);
  ASSERT_TRUE(PositionIds(good).ok());
  ASSERT_TRUE(TokenLossWeights(good, batch).ok());

  auto expect_refused = [&](const Microbatch& mb, const char* message) {
    const absl::Status positions = PositionIds(mb).status();
    EXPECT_EQ(positions.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(positions.message(), HasSubstr(message));
    const absl::Status weights = TokenLossWeights(mb, batch).status();
    EXPECT_EQ(weights.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(weights.message(), HasSubstr(message));
  };
  Microbatch claims_more = good;
  claims_more.set_num_tokens(int64_t{1} << 60);
  expect_refused(claims_more, "num_tokens 1152921504606846976 but cu_seqlens ends at 8");
  Microbatch negative = good;
  negative.set_cu_seqlens(1, -4);
  expect_refused(negative, "not strictly increasing at 1");
  Microbatch short_ids = good;
  short_ids.mutable_sequence_id()->RemoveLast();
  expect_refused(short_ids, "the microbatch is malformed");
  Microbatch far_begin = good;
  far_begin.mutable_token_begin()->Resize(far_begin.batch_index_size(), 0);
  far_begin.set_token_begin(0, std::numeric_limits<int64_t>::max() - 2);
  expect_refused(far_begin, "begins at token 9223372036854775805");
  Microbatch negative_begin = good;
  negative_begin.mutable_token_begin()->Resize(negative_begin.batch_index_size(), 0);
  negative_begin.set_token_begin(1, -1);
  expect_refused(negative_begin, "begins at token -1");

  // A token begin that fits the positions but not the batch: only TokenLossWeights knows.
  Microbatch beyond = good;
  beyond.mutable_token_begin()->Resize(beyond.batch_index_size(), 0);
  beyond.set_token_begin(0, std::numeric_limits<int64_t>::max() - 8);
  EXPECT_TRUE(PositionIds(beyond).ok());
  EXPECT_THAT(TokenLossWeights(beyond, batch).status().message(), HasSubstr("does not match"));

  // A batch whose weights do not cover its tokens (never read past them).
  std::vector<Sequence> short_weights = batch;
  short_weights[good.batch_index(0)].loss_weights = {1.0f};
  EXPECT_THAT(TokenLossWeights(good, short_weights).status().message(),
              HasSubstr("1 loss weights for"));

  Plan huge_cp = plan;
  huge_cp.mutable_limits()->set_cp_size(1 << 30);
  EXPECT_THAT(ShardTokenIndices(huge_cp, 0, 0).status().message(),
              HasSubstr("cp_size is 1073741824; it must be in [1, 1024]"));
  EXPECT_THAT(SplitMicrobatch(huge_cp, 0).status().message(), HasSubstr("1073741824"));
}

TEST(DeterminismTest, SameInputSameBytesAndDigest) {
  std::vector<Sequence> batch = Lengths({9, 1, 30, 7, 7, 12, 3, 25, 2});
  const PlanOptions options = PlanOptions::Of(32, 2);
  Plan a = MustPlan(batch, options);
  std::vector<Sequence> copy = batch;
  Plan b = MustPlan(copy, options);
  EXPECT_EQ(SerializePlan(a), SerializePlan(b));
  EXPECT_EQ(PlanDigest(a), PlanDigest(b));
  // Negative control: one token more in one sequence changes the digest.
  copy[4].num_tokens += 1;
  EXPECT_NE(PlanDigest(MustPlan(copy, options)), PlanDigest(a));
}

TEST(DeterminismTest, PlanningIntoAReusedPlanGivesTheSameBytes) {
  // A large plan, then smaller ones, with other CP sizes and policies, the in-order fallback
  // and a failure: the reused plan always equals a fresh one.
  std::vector<int64_t> many;
  for (int64_t i = 0; i < 500; ++i) many.push_back(1 + (i * 31) % 40);
  struct Case {
    std::vector<Sequence> batch;
    PlanOptions options;
  };
  const std::vector<Case> cases = {
      {Lengths(many), PlanOptions::Of(64, 4)},
      {Lengths({9, 1, 30, 7}), PlanOptions::Of(32, 2)},
      {Lengths({4, 3, 3, 4, 3, 3}), PlanOptions::Of(10)},  // falls back
      {Lengths(many), InOrder(128)},
      {Lengths({3}), PlanOptions::Of(8, 4)},
  };
  Plan reused;
  for (size_t c = 0; c < cases.size(); ++c) {
    ASSERT_TRUE(PlanMicrobatches(cases[c].batch, cases[c].options, reused).ok()) << c;
    EXPECT_TRUE(VerifyPlan(reused, cases[c].batch).ok()) << c;
    EXPECT_EQ(SerializePlan(reused), SerializePlan(MustPlan(cases[c].batch, cases[c].options)))
        << "case " << c;
  }
  const absl::Status bad = PlanMicrobatches(Lengths({5, 0}), PlanOptions::Of(8), reused);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reused.microbatches_size(), 0);
  EXPECT_EQ(reused.num_sequences(), 0);
}

TEST(DeterminismTest, DigestIsTheFramedHashOfThePlanBytes) {
  // Large enough that the streamed serialization crosses many hash buffers.
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < 20000; ++i) lengths.push_back(1 + (i * 7919) % 500);
  Plan plan = MustPlan(Lengths(lengths), PlanOptions::Of(1024, 4));
  const std::string bytes = SerializePlan(plan);
  ASSERT_GT(bytes.size(), size_t{200000});
  EXPECT_EQ(PlanDigest(plan), Sha256Framed({kPlanDigestTag, bytes}));
  Plan parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_EQ(SerializePlan(parsed), bytes);
}

TEST(DeterminismTest, OneDifferentLossWeightWithTheSameTotalsChangesTheDigest) {
  std::vector<Sequence> batch = Lengths({5, 8, 3});
  batch[1].loss_weights = {1, 0, 1, 1, 0.5f, 1, 1, 1};
  std::vector<Sequence> other = batch;
  // One token's weight differs; moving the difference to another token keeps every total (so
  // every loss scale) the same.
  other[1].loss_weights[4] = 0.25f;
  other[1].loss_weights[2] = 1.25f;
  for (LossNormalization norm : {LOSS_TOKEN_MEAN, LOSS_SUM, LOSS_SEQUENCE_MEAN}) {
    const PlanOptions options = Normalized(16, norm, 2);
    Plan a = MustPlan(batch, options);
    Plan b = MustPlan(other, options);
    EXPECT_NE(a.loss_weights_digest(), b.loss_weights_digest());
    EXPECT_NE(PlanDigest(a), PlanDigest(b));
    // Everything else is identical: the weights digest is what tells the replicas apart.
    a.clear_loss_weights_digest();
    b.clear_loss_weights_digest();
    EXPECT_EQ(SerializePlan(a), SerializePlan(b));
  }
  // A plan of one batch does not verify against the other.
  Plan a = MustPlan(batch, PlanOptions::Of(16));
  EXPECT_THAT(VerifyPlan(a, other).message(), HasSubstr("loss weights digest"));
}

TEST(DeterminismTest, LossWeightsDigestFraming) {
  std::vector<Sequence> none = Lengths({2, 2});
  std::vector<Sequence> ones = none;
  ones[0].loss_weights = {1, 1};
  std::vector<Sequence> moved = none;
  moved[1].loss_weights = {1, 1};
  std::vector<Sequence> negative_zero = ones;
  negative_zero[0].loss_weights[1] = -0.0f;
  std::vector<Sequence> zero = ones;
  zero[0].loss_weights[1] = 0.0f;
  EXPECT_EQ(LossWeightsDigest(none), LossWeightsDigest(Lengths({7, 9})));
  // Without weights, the digest is of the framed tag alone (computed once, not per plan): the
  // same bytes as the general form, pinned (Python: sha256(pack('<Q', 32) + tag)).
  EXPECT_EQ(DigestHex(LossWeightsDigest(none)),
            "602fd00a1dab7822386f31d26e288858f9b27e2a846e35faa8534d6235f5930d");
  Sha256Hasher general;
  general.AppendFramed(kLossWeightsDigestTag);
  EXPECT_EQ(LossWeightsDigest(none), general.Finish());
  EXPECT_NE(LossWeightsDigest(none), LossWeightsDigest(ones));
  EXPECT_NE(LossWeightsDigest(ones), LossWeightsDigest(moved));
  EXPECT_NE(LossWeightsDigest(zero), LossWeightsDigest(negative_zero));
  // Ids are not part of the weights digest (the plan records them itself).
  std::vector<Sequence> other_ids = ones;
  for (Sequence& sequence : other_ids) sequence.id += 1000;
  EXPECT_EQ(LossWeightsDigest(ones), LossWeightsDigest(other_ids));
}

struct BadInput {
  const char* name;
  std::vector<Sequence> batch;
  PlanOptions options;
  std::vector<const char*> message_parts;
};

class BadInputTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadInputTest, IsRefusedWithAClearError) {
  const BadInput& bad = GetParam();
  absl::StatusOr<Plan> plan = PlanMicrobatches(bad.batch, bad.options);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* part : bad.message_parts) {
    EXPECT_THAT(plan.status().message(), HasSubstr(part));
  }
}

std::vector<Sequence> WithWeights(std::vector<int64_t> lengths, int which,
                                  std::vector<float> weights) {
  std::vector<Sequence> batch = Lengths(lengths);
  batch[which].loss_weights = std::move(weights);
  return batch;
}

INSTANTIATE_TEST_SUITE_P(
    AllCases, BadInputTest,
    ::testing::Values(
        BadInput{"ZeroBudget",
                 Lengths({4}),
                 PlanOptions::Of(0),
                 {"max_tokens_per_microbatch is 0", "must be positive"}},
        BadInput{"NegativeBudget",
                 Lengths({4}),
                 PlanOptions::Of(-5),
                 {"max_tokens_per_microbatch is -5"}},
        BadInput{"ZeroCp", Lengths({4}), PlanOptions::Of(8, 0), {"cp_size is 0"}},
        BadInput{"NegativeCp", Lengths({4}), PlanOptions::Of(8, -2), {"cp_size is -2"}},
        BadInput{
            "CpOverTheLimit",
            Lengths({4}),
            PlanOptions::Of(std::numeric_limits<int64_t>::max(), std::numeric_limits<int>::max()),
            {"cp_size is 2147483647; it must be in [1, 1024]"}},
        BadInput{"BatchBeyondInt64Tokens",
                 Lengths({int64_t{1} << 62, int64_t{1} << 62}),
                 PlanOptions::Of(std::numeric_limits<int64_t>::max()),
                 {"the batch holds more than 9223372036854775807 tokens at sequence 1"}},
        BadInput{"BudgetCannotServeCp",
                 Lengths({4}),
                 PlanOptions::Of(7, 4),
                 {"max_tokens_per_microbatch 7 cannot serve cp_size 4", "2 x cp_size = 8"}},
        BadInput{"EmptyBatch", {}, PlanOptions::Of(8), {"no sequences"}},
        BadInput{"SequenceLongerThanBudget",
                 Lengths({5, 70000, 3}),
                 PlanOptions::Of(65536),
                 {"sequence 1 (id 101) has 70000 tokens", "at most 65536"}},
        BadInput{"ZeroLengthSequence",
                 Lengths({5, 0}),
                 PlanOptions::Of(8),
                 {"sequence 1 (id 101) has 0 tokens"}},
        BadInput{"NegativeLengthSequence",
                 Lengths({-3}),
                 PlanOptions::Of(8),
                 {"sequence 0 (id 100) has -3 tokens"}},
        BadInput{"WeightCountMismatch",
                 WithWeights({3, 4}, 1, {1, 1, 1}),
                 PlanOptions::Of(8),
                 {"sequence 1 (id 101) has 3 loss weights for 4 tokens"}},
        BadInput{"NegativeWeight",
                 WithWeights({3}, 0, {1, -1, 1}),
                 PlanOptions::Of(8),
                 {"sequence 0 (id 100): loss weight of token 1 is -1"}},
        BadInput{"NanWeight",
                 WithWeights({2}, 0, {1, std::numeric_limits<float>::quiet_NaN()}),
                 PlanOptions::Of(8),
                 {"loss weight of token 1 is nan"}},
        BadInput{"AllWeightsZeroForTokenMean",
                 WithWeights({2}, 0, {0, 0}),
                 PlanOptions::Of(8),
                 {"loss weights sum to 0", "token-mean"}},
        BadInput{"SequenceWeightsZeroForSequenceMean",
                 WithWeights({2, 3}, 1, {0, 0, 0}),
                 Normalized(8, LOSS_SEQUENCE_MEAN),
                 {"sequence 1 (id 101): its loss weights sum to 0", "per-sequence-mean"}},
        BadInput{"UnspecifiedPacking",
                 Lengths({2}),
                 [] {
                   PlanOptions options = PlanOptions::Of(8);
                   options.packing = PACKING_POLICY_UNSPECIFIED;
                   return options;
                 }(),
                 {"packing policy 0"}},
        BadInput{"UnspecifiedNormalisation",
                 Lengths({2}),
                 Normalized(8, LOSS_NORMALIZATION_UNSPECIFIED),
                 {"loss normalization 0"}}),
    [](const ::testing::TestParamInfo<BadInput>& info) { return info.param.name; });

}  // namespace
}  // namespace planner
}  // namespace lockstep
