#include "trainer/fake_cp_rank.h"

#include <utility>

#include "base/status_macros.h"
#include "collectives/rank_groups.h"
#include "collectives/topology.h"
#include "trainer/internal/contract_seams.h"

namespace lockstep {
namespace trainer {

absl::StatusOr<FakeCpRank> CreateFakeCpRank(collectives::Communicator& world, int64_t max_tokens,
                                            ForwardAdapter forward) {
  const int cp = world.size();
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::Topology topology,
                            collectives::Topology::CreateExact(cp, 1, 1, cp));
  FakeCpRank rank;
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::RankGroups groups,
                            collectives::RankGroups::CreateBorrowing(world, topology));
  rank.group = groups.tp_cp();
  LOCKSTEP_ASSIGN_OR_RETURN(rank.streams,
                            rng::RankStreams::Create(rng::DefaultGenerators::CpuOnly()));
  TrainerConfig config = TrainerConfig::Of(max_tokens);
  config.plan.packing = planner::PACKING_IN_ORDER;
  // The threads share one process's default generators: no scope, no synchronization.
  internal::ContractSeams seams;
  seams.model_stream_scope = false;
  seams.synchronize_at_create = false;
  seams.synchronize_at_registration = false;
  seams.synchronize_after_each_microbatch = false;
  seams.synchronize_after_all_microbatches = false;
  LOCKSTEP_ASSIGN_OR_RETURN(
      rank.trainer,
      internal::CreateWithSeams(config,
                                TrainerRank::Collaborators::Of(std::move(topology), world.rank(),
                                                               rank.group, rank.streams),
                                std::move(forward), seams));
  return rank;
}

absl::StatusOr<PlannedShardTokens> PlannedTokensOf(const ShardWork& work,
                                                   const std::vector<planner::Sequence>& batch) {
  PlannedShardTokens tokens;
  LOCKSTEP_ASSIGN_OR_RETURN(tokens.offsets,
                            planner::ShardTokenIndices(*work.plan, work.microbatch, work.cp_rank));
  const planner::Microbatch& mb = work.plan->microbatches(work.microbatch);
  for (int64_t t : tokens.offsets) {
    int k = 0;
    while (mb.cu_seqlens(k + 1) <= t) ++k;
    const int64_t position = planner::TokenBegin(mb, k) + (t - mb.cu_seqlens(k));
    int64_t first_row = 0;
    for (int b = 0; b < mb.batch_index(k); ++b) first_row += batch[b].num_tokens;
    tokens.input_rows.push_back(first_row + position);
    tokens.ids.push_back(batch[mb.batch_index(k)].id);
    tokens.positions.push_back(position);
  }
  return tokens;
}

}  // namespace trainer
}  // namespace lockstep
