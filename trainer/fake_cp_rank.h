// trainer/fake_cp_rank.h  (testonly)
//
// Test support for TrainerRank on the thread fake world (testing/fake_communicator.h): one
// rank of a CP group with the collaborators it owns, and the plan's account, token by token, of a
// shard, to check what the forward adapter receives against it.
//
// Example (inside FakeWorld::Run's body for rank `world`):
//   LOCKSTEP_ASSIGN_OR_RETURN(FakeCpRank rank, CreateFakeCpRank(world, 2, 64, forward));
//   LOCKSTEP_ASSIGN_OR_RETURN(auto outputs, rank.trainer->DpRankForward(inputs));

#ifndef LOCKSTEP_TRAINER_FAKE_CP_RANK_H_
#define LOCKSTEP_TRAINER_FAKE_CP_RANK_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "planner/planner.h"
#include "rng/rank_streams.h"
#include "trainer/trainer_rank.h"

namespace lockstep {
namespace trainer {

// A TrainerRank of `world`'s rank in a CP group of all `world`'s ranks (no DP, no TP), with the
// group and streams it uses (declared first: destroyed after it).
struct FakeCpRank {
  std::shared_ptr<collectives::Communicator> group;
  std::shared_ptr<rng::RankStreams> streams;
  std::unique_ptr<TrainerRank> trainer;
};

// Microbatches of at most `max_tokens`, packed in input order. The model-stream scope and the
// caller's synchronization are off: the fake's threads share one process's default generators,
// so the RNG contract is tested on processes (//qualification:oracle_test) and these tests test the
// rest.
absl::StatusOr<FakeCpRank> CreateFakeCpRank(collectives::Communicator& world, int64_t max_tokens,
                                            ForwardAdapter forward);

// What the plan assigns to the shard `work` holds, in the shard's order: each token's packed
// offset (ShardTokenIndices), the caller's input row (the rows of `batch`'s sequences in order),
// its sequence's id and its position in that sequence.
struct PlannedShardTokens {
  std::vector<int64_t> offsets;
  std::vector<int64_t> input_rows;
  std::vector<int64_t> ids;
  std::vector<int64_t> positions;
};
absl::StatusOr<PlannedShardTokens> PlannedTokensOf(const ShardWork& work,
                                                   const std::vector<planner::Sequence>& batch);

}  // namespace trainer
}  // namespace lockstep

#endif  // LOCKSTEP_TRAINER_FAKE_CP_RANK_H_
