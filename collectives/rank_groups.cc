#include "collectives/rank_groups.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace lockstep {
namespace collectives {

absl::StatusOr<RankGroups> RankGroups::Create(std::shared_ptr<Communicator> world,
                                              const Topology& topology) {
  if (world == nullptr) return absl::InvalidArgumentError("RankGroups needs a world, got null");
  if (world->size() != topology.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the topology ", topology.DebugString(), " describes ", topology.world_size(),
                     " ranks; the world ", world->DebugName(), " has ", world->size()));
  }
  const int rank = world->rank();
  LOCKSTEP_ASSIGN_OR_RETURN(Coordinates me, topology.CoordinatesOf(rank));
  RankGroups groups(world, topology, me);
  // One order on every rank (rank_groups.h): the groups' identities depend on it.
  LOCKSTEP_ASSIGN_OR_RETURN(groups.tp_cp_, world->NewGroup(topology.TpCpGroup(rank)));
  LOCKSTEP_ASSIGN_OR_RETURN(groups.tp_, world->NewGroup(topology.TpGroup(rank)));
  LOCKSTEP_ASSIGN_OR_RETURN(groups.cp_, world->NewGroup(topology.CpGroup(rank)));
  LOCKSTEP_ASSIGN_OR_RETURN(groups.dp_, world->NewGroup(topology.DpGroup(rank)));
  return groups;
}

absl::StatusOr<RankGroups> RankGroups::CreateBorrowing(Communicator& world,
                                                       const Topology& topology) {
  // The aliasing constructor: a pointer that owns nothing (the precondition keeps it valid).
  return Create(std::shared_ptr<Communicator>(std::shared_ptr<Communicator>(), &world), topology);
}

}  // namespace collectives
}  // namespace lockstep
