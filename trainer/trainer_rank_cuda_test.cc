// gpu: a CP group's shards selected from CUDA input rows (thread fake world, one GPU). A few runs
// of rows outside autograd are copied by one cudaMemcpyAsync each, the first microbatch's ahead of
// the plan agreement; rows that require gradients, and many runs, go through ATen. Either way the
// model must receive exactly the rows the plan assigns to the rank, every rank the full outputs in
// packed order, and the rows the gradient of the rank's own shards.

#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "testing/fake_communicator.h"
#include "trainer/fake_cp_rank.h"
#include "trainer/trainer_rank.h"

namespace lockstep {
namespace trainer {
namespace {

absl::Status SelectionBody(collectives::Communicator& world,
                           const std::vector<planner::Sequence>& batch, int64_t max_tokens,
                           bool rows_require_grad) {
  int64_t tokens = 0;
  for (const planner::Sequence& s : batch) tokens += s.num_tokens;
  // Row r holds (3r, 3r + 1, 3r + 2).
  const at::Tensor rows_on_host = at::arange(3 * tokens, at::kFloat).reshape({tokens, 3});
  at::Tensor rows = rows_on_host.to(at::kCUDA);
  if (rows_require_grad) rows.requires_grad_();
  const at::Tensor w = at::full({1}, 2.0, at::TensorOptions().device(at::kCUDA));
  std::vector<int64_t> own_rows;
  LOCKSTEP_ASSIGN_OR_RETURN(
      FakeCpRank rank,
      CreateFakeCpRank(world, max_tokens, [&](const ShardWork& work) -> absl::StatusOr<at::Tensor> {
        LOCKSTEP_ASSIGN_OR_RETURN(PlannedShardTokens planned, PlannedTokensOf(work, batch));
        const at::Tensor expected =
            rows_on_host.index_select(0, at::tensor(planned.input_rows, at::kLong));
        if (!work.inputs.is_cuda() || !at::equal(work.inputs.detach().cpu(), expected)) {
          return absl::InternalError(
              absl::StrCat("CP rank ", work.cp_rank, ", microbatch ", work.microbatch,
                           ": the shard's inputs are not the rows the plan assigns it"));
        }
        own_rows.insert(own_rows.end(), planned.input_rows.begin(), planned.input_rows.end());
        return work.inputs * w;
      }));
  LOCKSTEP_ASSIGN_OR_RETURN(MicrobatchStream stream,
                            rank.trainer->ForwardMicrobatches(TrainerInputs::Of(batch, rows)));
  at::Tensor total = at::zeros({}, at::TensorOptions().device(at::kCUDA));
  while (true) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::optional<MicrobatchOutput> out, stream.Next());
    if (!out.has_value()) break;
    if (!at::equal(out->outputs.detach().cpu(),
                   rows_on_host.index_select(0, out->input_rows) * 2)) {
      return absl::InternalError(absl::StrCat("rank ", world.rank(), ": microbatch ",
                                              out->microbatch, " gathered wrong outputs"));
    }
    total = total + out->outputs.sum();
  }
  if (!rows_require_grad) return absl::OkStatus();
  total.backward();
  at::Tensor expected = at::zeros({tokens, 3}, at::kFloat);
  if (!own_rows.empty()) expected.index_fill_(0, at::tensor(own_rows, at::kLong), 2.0);
  if (!rows.grad().defined() || !at::equal(rows.grad().cpu(), expected)) {
    return absl::InternalError(absl::StrCat("rank ", world.rank(),
                                            ": the input rows' gradient is not 2 on each of its "
                                            "own rows and 0 elsewhere"));
  }
  return absl::OkStatus();
}

struct Case {
  const char* name;
  int cp;
  std::vector<planner::Sequence> batch;
  int64_t max_tokens;
};

std::vector<Case> Cases() {
  std::vector<planner::Sequence> short_ones;  // 20 x 4 tokens: ~20 runs per rank, past the copies
  for (int i = 0; i < 20; ++i) short_ones.push_back(planner::Sequence::Of(4, i + 1));
  return {
      {"one sequence, CP2", 2, {planner::Sequence::Of(64, 7)}, 64},
      {"one sequence, CP4", 4, {planner::Sequence::Of(64, 7)}, 64},
      {"one sequence of unequal chunks, CP4", 4, {planner::Sequence::Of(67, 7)}, 67},
      {"three sequences, two microbatches, CP2",
       2,
       {planner::Sequence::Of(40, 1), planner::Sequence::Of(24, 2), planner::Sequence::Of(16, 3)},
       64},
      {"twenty short sequences, CP2", 2, short_ones, 80},
  };
}

TEST(TrainerRankCudaTest, ShardsOfCudaRowsAreTheAssignedRows) {
  ASSERT_TRUE(at::hasCUDA()) << "a gpu test: it needs a CUDA device";
  for (const Case& c : Cases()) {
    for (const bool grad : {false, true}) {
      collectives::FakeWorld world(c.cp);
      for (const absl::Status& s : world.Run([&](collectives::Communicator& w) {
             return SelectionBody(w, c.batch, c.max_tokens, grad);
           })) {
        EXPECT_TRUE(s.ok()) << c.name << (grad ? ", rows with gradients" : "") << ": " << s;
      }
    }
  }
}

}  // namespace
}  // namespace trainer
}  // namespace lockstep
