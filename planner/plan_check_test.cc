// Negative controls for VerifyPlan: a valid plan passes, and each corruption of what a compact
// plan stores (a dropped or duplicated microbatch or sequence, an over-budget microbatch, broken
// boundaries, shifted token ranges, a missing or mislabelled shard, wrong shard counts, an
// unknown chunk rule, a changed loss scale or loss weights digest, a wrong loss weight total,
// unknown or inconsistent packing policies, impossible split counts and CP sizes, token offsets
// near 2^63) is reported.

#include "planner/plan_check.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "planner/planner_testutil.h"

namespace lockstep {
namespace planner {
namespace {

using ::testing::HasSubstr;

struct Corruption {
  const char* name;
  std::function<void(Plan&)> corrupt;
  const char* message_part;
};

class VerifyPlanTest : public ::testing::TestWithParam<Corruption> {
 protected:
  void SetUp() override {
    RandomBatchOptions batch_options;
    batch_options.distribution = LengthDistribution::kUniform;
    batch_options.num_sequences = 40;
    batch_options.max_length = 50;
    batch_options.seed = 5;
    batch_options.weighted_fraction = 0.5;
    batch_ = RandomBatch(batch_options);
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(plan_, PlanMicrobatches(batch_, PlanOptions::Of(128, 2)));
    ASSERT_GE(plan_.microbatches_size(), 3);
    ASSERT_GE(plan_.microbatches(0).batch_index_size(), 2);
    // The first packed sequence (the longest) has chunks of more than 3 tokens.
    ASSERT_GT(plan_.microbatches(0).cu_seqlens(1), 4 * 4);
  }
  std::vector<Sequence> batch_;
  Plan plan_;
};

TEST_P(VerifyPlanTest, ValidPlanPassesAndCorruptionIsReported) {
  ASSERT_TRUE(VerifyPlan(plan_, batch_).ok()) << VerifyPlan(plan_, batch_);
  Plan corrupted = plan_;
  GetParam().corrupt(corrupted);
  const absl::Status status = VerifyPlan(corrupted, batch_);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(GetParam().message_part));
}

Microbatch& Mb(Plan& p, int m) { return *p.mutable_microbatches(m); }

// Sets microbatch m's shard counts to what ShardPieces derives, so that a corruption of the
// packed sequences is caught by the coverage checks rather than by the shard counts.
void Recount(Plan& p, int m) {
  for (int r = 0; r < p.microbatches(m).shard_cp_rank_size(); ++r) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const std::vector<ShardPiece> pieces, ShardPieces(p, m, r));
    int64_t tokens = 0;
    for (const ShardPiece& piece : pieces) tokens += piece.end - piece.begin;
    Mb(p, m).set_shard_num_tokens(r, tokens);
    Mb(p, m).set_shard_num_pieces(r, static_cast<int>(pieces.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Corruptions, VerifyPlanTest,
    ::testing::Values(
        Corruption{"DroppedMicrobatch", [](Plan& p) { p.mutable_microbatches()->RemoveLast(); },
                   "in no microbatch"},
        Corruption{"DuplicatedMicrobatch",
                   [](Plan& p) { *p.add_microbatches() = p.microbatches(0); }, "planned twice"},
        Corruption{"DroppedSequence",
                   [](Plan& p) {
                     // The last packed sequence of microbatch 0 goes, consistently everywhere.
                     Microbatch& mb = *p.mutable_microbatches(0);
                     mb.mutable_batch_index()->RemoveLast();
                     mb.mutable_sequence_id()->RemoveLast();
                     // (A fresh plan stores no token begins and one shared loss scale.)
                     mb.mutable_cu_seqlens()->RemoveLast();
                     mb.set_num_tokens(mb.cu_seqlens(mb.cu_seqlens_size() - 1));
                     Recount(p, 0);
                   },
                   "in no microbatch"},
        Corruption{
            "ShardTokenCountWrong",
            [](Plan& p) { Mb(p, 0).set_shard_num_tokens(0, Mb(p, 0).shard_num_tokens(0) + 1); },
            "its pieces hold"},
        Corruption{"TokensMovedBetweenShards",
                   [](Plan& p) {
                     // Same microbatch total, but rank 1 claims 3 of rank 0's tokens.
                     Mb(p, 0).set_shard_num_tokens(0, Mb(p, 0).shard_num_tokens(0) - 3);
                     Mb(p, 0).set_shard_num_tokens(1, Mb(p, 0).shard_num_tokens(1) + 3);
                   },
                   "CP rank 0 says"},
        Corruption{
            "ShardPieceCountWrong",
            [](Plan& p) { Mb(p, 1).set_shard_num_pieces(1, Mb(p, 1).shard_num_pieces(1) - 1); },
            "pieces; the chunk rule gives it"},
        Corruption{"MissingShard",
                   [](Plan& p) {
                     Mb(p, 0).mutable_shard_cp_rank()->RemoveLast();
                     Mb(p, 0).mutable_shard_num_tokens()->RemoveLast();
                     Mb(p, 0).mutable_shard_num_pieces()->RemoveLast();
                   },
                   "1/1/1 CP shard entries (ranks/tokens/pieces) for cp_size 2"},
        Corruption{"MissingShardTokenCount",
                   [](Plan& p) { Mb(p, 2).mutable_shard_num_tokens()->RemoveLast(); },
                   "2/1/2 CP shard entries"},
        Corruption{"ShardsSwapped",
                   [](Plan& p) {
                     Mb(p, 0).mutable_shard_cp_rank()->SwapElements(0, 1);
                     Mb(p, 0).mutable_shard_num_tokens()->SwapElements(0, 1);
                     Mb(p, 0).mutable_shard_num_pieces()->SwapElements(0, 1);
                   },
                   "shard entry 0 has cp_rank 1"},
        Corruption{"UnknownChunkRule",
                   [](Plan& p) { p.set_cp_chunk_rule(CP_CHUNK_RULE_UNSPECIFIED); },
                   "CP chunk rule is 0"},
        Corruption{"CpSizeChanged", [](Plan& p) { p.mutable_limits()->set_cp_size(4); },
                   "2/2/2 CP shard entries (ranks/tokens/pieces) for cp_size 4"},
        Corruption{"OverBudget",
                   [](Plan& p) { p.mutable_limits()->set_max_tokens_per_microbatch(10); },
                   "the budget is 10"},
        Corruption{"BrokenCuSeqlens",
                   [](Plan& p) {
                     Microbatch& mb = *p.mutable_microbatches(0);
                     mb.set_cu_seqlens(1, mb.cu_seqlens(2));
                   },
                   "strictly increasing"},
        Corruption{"ShiftedBoundary",
                   [](Plan& p) {
                     // One token moves from packed sequence 1 to packed sequence 0.
                     Microbatch& mb = *p.mutable_microbatches(0);
                     mb.set_cu_seqlens(1, mb.cu_seqlens(1) + 1);
                     Recount(p, 0);
                   },
                   "does not match sequence"},
        Corruption{"WrongNumTokens",
                   [](Plan& p) {
                     Microbatch& mb = *p.mutable_microbatches(1);
                     mb.set_num_tokens(mb.num_tokens() - 1);
                   },
                   "but cu_seqlens ends at"},
        Corruption{"WrongId", [](Plan& p) { p.mutable_microbatches(0)->set_sequence_id(0, 99999); },
                   "does not match sequence"},
        Corruption{"ShiftedTokenBegin",
                   [](Plan& p) {
                     Microbatch& mb = *p.mutable_microbatches(0);
                     mb.mutable_token_begin()->Resize(mb.batch_index_size(), 0);
                     mb.set_token_begin(0, 1);
                   },
                   "does not match sequence"},
        Corruption{"TokenBeginCountWrong",
                   [](Plan& p) { p.mutable_microbatches(1)->add_token_begin(0); },
                   "token begins: 0 or"},
        Corruption{"LossScaleCountWrong",
                   [](Plan& p) {
                     Microbatch& mb = *p.mutable_microbatches(1);
                     mb.add_loss_scale(mb.loss_scale(0));
                   },
                   "loss scales: 1 or"},
        Corruption{"ChangedOneOfPerSequenceLossScales",
                   [](Plan& p) {
                     // Spelled out per sequence, equal values are valid; one changed is not.
                     Microbatch& mb = *p.mutable_microbatches(0);
                     const double shared = mb.loss_scale(0);
                     mb.mutable_loss_scale()->Resize(mb.batch_index_size(), shared);
                     mb.set_loss_scale(1, shared * 2);
                   },
                   "packed sequence 1 has loss scale"},
        Corruption{"ChangedLossScale",
                   [](Plan& p) {
                     Microbatch& mb = *p.mutable_microbatches(2);
                     mb.set_loss_scale(0, mb.loss_scale(0) * (1 + 1e-9));
                   },
                   "loss scale"},
        Corruption{"ChangedLossWeightsDigest",
                   [](Plan& p) {
                     std::string digest = p.loss_weights_digest();
                     digest[31] = static_cast<char>(digest[31] ^ 1);
                     p.set_loss_weights_digest(digest);
                   },
                   "does not match the batch's per-token loss weights"},
        Corruption{"WrongTotals", [](Plan& p) { p.set_num_tokens(p.num_tokens() + 1); },
                   "the batch has 40"},
        Corruption{"ZeroLossWeightTotal", [](Plan& p) { p.set_loss_weight_total(0); },
                   "the plan's loss weight total 0 is not the batch's"},
        Corruption{"HugeNegativeLossWeightTotal",
                   [](Plan& p) { p.set_loss_weight_total(-1.8e100); },
                   "loss weight total -1.8e+100"},
        Corruption{"NanLossWeightTotal", [](Plan& p) { p.set_loss_weight_total(std::nan("")); },
                   "loss weight total nan"},
        Corruption{"UnknownPackingLimit",
                   [](Plan& p) { p.mutable_limits()->set_packing(static_cast<PackingPolicy>(7)); },
                   "the limits ask for policy 7"},
        Corruption{"UnknownPackingApplied",
                   [](Plan& p) { p.set_packing_applied(static_cast<PackingPolicy>(-3)); },
                   "the plan applied -3"},
        Corruption{"FirstFitAppliedUnderInOrder",
                   [](Plan& p) {
                     p.mutable_limits()->set_packing(PACKING_IN_ORDER);
                     p.set_packing_applied(PACKING_FIRST_FIT_DECREASING);
                   },
                   "the limits ask for policy 2, the plan applied 1"},
        Corruption{"NegativeSplits", [](Plan& p) { p.set_splits(-1); }, "split -1 times"},
        Corruption{"MoreSplitsThanMicrobatches",
                   [](Plan& p) { p.set_splits(p.microbatches_size()); },
                   "can have been split 0 to"},
        Corruption{"HugeCpSize", [](Plan& p) { p.mutable_limits()->set_cp_size(1 << 30); },
                   "cp_size 1073741824 (cp_size in [1, 1024]"},
        Corruption{"BudgetUnderTwoChunksPerRank",
                   [](Plan& p) { p.mutable_limits()->set_cp_size(100); }, "at least 2 x cp_size"},
        Corruption{"TokenBeginNearInt64Max",
                   [](Plan& p) {
                     Microbatch& mb = *p.mutable_microbatches(0);
                     mb.mutable_token_begin()->Resize(mb.batch_index_size(), 0);
                     mb.set_token_begin(0, std::numeric_limits<int64_t>::max() - 1);
                   },
                   "tokens from token 9223372036854775806) does not match"}),
    [](const ::testing::TestParamInfo<Corruption>& info) { return info.param.name; });

TEST(VerifyPlanBatchTest, AnUnplannableBatchIsNamedNotSummedPastInt64) {
  const std::vector<Sequence> batch = {Sequence::Of(10, 1)};
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Plan plan, PlanMicrobatches(batch, PlanOptions::Of(16)));
  ASSERT_TRUE(VerifyPlan(plan, batch).ok());
  const std::vector<Sequence> huge = {Sequence::Of(std::numeric_limits<int64_t>::max(), 1),
                                      Sequence::Of(2, 2)};
  EXPECT_THAT(VerifyPlan(plan, huge).message(), HasSubstr("the batch is not plannable"));
  EXPECT_THAT(VerifyPlan(plan, {Sequence::Of(-5, 1)}).message(), HasSubstr("has -5 tokens"));
}

}  // namespace
}  // namespace planner
}  // namespace lockstep
