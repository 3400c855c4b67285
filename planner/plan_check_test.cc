// Negative controls for VerifyPlan: a valid plan passes, and each kind of corruption that the
// property tests rely on it to catch (a dropped or duplicated token, an over-budget microbatch,
// broken boundaries, a missing or wrong shard, a changed loss scale) is reported.

#include "planner/plan_check.h"

#include <functional>
#include <string>
#include <vector>

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
    batch_ = RandomBatch({.distribution = LengthDistribution::kUniform,
                          .num_sequences = 40,
                          .max_length = 50,
                          .seed = 5,
                          .weighted_fraction = 0.5});
    plan_ = *PlanMicrobatches(batch_, {.max_tokens_per_microbatch = 128, .cp_size = 2});
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

CpShard& Shard(Plan& p, int m, int r) { return *p.mutable_microbatches(m)->mutable_shards(r); }

INSTANTIATE_TEST_SUITE_P(
    Corruptions, VerifyPlanTest,
    ::testing::Values(
        Corruption{"DroppedMicrobatch", [](Plan& p) { p.mutable_microbatches()->RemoveLast(); },
                   "in no microbatch"},
        Corruption{"DuplicatedMicrobatch",
                   [](Plan& p) { *p.add_microbatches() = p.microbatches(0); }, "planned twice"},
        Corruption{"DroppedPiece",
                   [](Plan& p) {
                     CpShard& s = Shard(p, 1, 0);
                     s.set_num_tokens(s.num_tokens() - (s.piece_end(0) - s.piece_begin(0)));
                     s.mutable_piece_sequence()->erase(s.mutable_piece_sequence()->begin());
                     s.mutable_piece_chunk()->erase(s.mutable_piece_chunk()->begin());
                     s.mutable_piece_begin()->erase(s.mutable_piece_begin()->begin());
                     s.mutable_piece_end()->erase(s.mutable_piece_end()->begin());
                   },
                   "owned by no CP rank"},
        Corruption{"PieceOwnedTwice",
                   [](Plan& p) {
                     CpShard& s = Shard(p, 0, 1);
                     s.add_piece_sequence(s.piece_sequence(0));
                     s.add_piece_chunk(s.piece_chunk(0));
                     s.add_piece_begin(s.piece_begin(0));
                     s.add_piece_end(s.piece_end(0));
                     s.set_num_tokens(s.num_tokens() + s.piece_end(0) - s.piece_begin(0));
                   },
                   "owned twice"},
        Corruption{"ShardTokenCountWrong",
                   [](Plan& p) { Shard(p, 0, 0).set_num_tokens(Shard(p, 0, 0).num_tokens() + 1); },
                   "its pieces hold"},
        Corruption{"MissingEmptyShard",
                   [](Plan& p) { p.mutable_microbatches(0)->mutable_shards()->RemoveLast(); },
                   "1 CP shards for cp_size 2"},
        Corruption{"ChunkOfAnotherRank", [](Plan& p) { Shard(p, 0, 0).set_piece_chunk(0, 1); },
                   "may own only 0 and 3"},
        Corruption{"OverBudget",
                   [](Plan& p) { p.mutable_limits()->set_max_tokens_per_microbatch(10); },
                   "the budget is 10"},
        Corruption{"BrokenCuSeqlens",
                   [](Plan& p) {
                     Microbatch& mb = *p.mutable_microbatches(0);
                     mb.set_cu_seqlens(1, mb.cu_seqlens(2));
                   },
                   "strictly increasing"},
        Corruption{"WrongId", [](Plan& p) { p.mutable_microbatches(0)->set_sequence_id(0, 99999); },
                   "does not match sequence"},
        Corruption{"ShiftedTokenBegin",
                   [](Plan& p) { p.mutable_microbatches(0)->set_token_begin(0, 1); },
                   "does not match sequence"},
        Corruption{"ChangedLossScale",
                   [](Plan& p) {
                     Microbatch& mb = *p.mutable_microbatches(2);
                     mb.set_loss_scale(0, mb.loss_scale(0) * (1 + 1e-9));
                   },
                   "loss scale"},
        Corruption{"WrongTotals", [](Plan& p) { p.set_num_tokens(p.num_tokens() + 1); },
                   "the batch has 40"},
        Corruption{"Imbalanced",
                   [](Plan& p) {
                     // Move the boundary between chunk 0 (rank 0) and chunk 1 (rank 1) of the
                     // first, longest sequence by 3 tokens: still a tiling, but 6 tokens apart.
                     CpShard& r0 = Shard(p, 0, 0);
                     CpShard& r1 = Shard(p, 0, 1);
                     r0.set_piece_end(0, r0.piece_end(0) + 3);
                     r1.set_piece_begin(0, r1.piece_begin(0) + 3);
                     r0.set_num_tokens(r0.num_tokens() + 3);
                     r1.set_num_tokens(r1.num_tokens() - 3);
                   },
                   "the balance allows a difference of 2"}),
    [](const ::testing::TestParamInfo<Corruption>& info) { return info.param.name; });

}  // namespace
}  // namespace planner
}  // namespace lockstep
