// collectives/rank_groups.h
//
// RankGroups owns one rank's process groups in a DP x TP x CP job: the world it was made from
// and, under a Topology, the rank's TP, CP, DP and TP x CP groups. Every program that trains or
// qualifies a rank (the example, qualify's checks and oracle, the variability checks, the
// benchmarks, the demo) makes its groups here, in one order, so that the groups line up across
// ranks and the question "does this dimension need a collective?" is answered in one place
// (Note [A group of one is no group] in communicator.h).
//
// Creating the groups is collective over the world: every rank calls Create at the same point
// of its sequence of NewGroup calls, with the same topology (the groups are made TP x CP, TP, CP,
// DP, in that order, on every rank).
//
// Thread-safety: the accessors are const and safe to call concurrently; the communicators they
// return follow communicator.h (one thread at a time per communicator).
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(auto rendezvous, Rendezvous::FromEnvironment(timeout));
//   LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world,
//                             GlooCommunicator::Create(rendezvous, options));
//   LOCKSTEP_ASSIGN_OR_RETURN(Topology topology, Topology::Create(world->size(), tp, cp));
//   LOCKSTEP_ASSIGN_OR_RETURN(RankGroups groups, RankGroups::Create(std::move(world), topology));
//   Communicator* cp = groups.cp_or_null();     // nullptr at CP 1: no CP collectives
//   collaborators.tp_cp_group = groups.tp_cp();  // a TrainerRank's replicas

#ifndef LOCKSTEP_COLLECTIVES_RANK_GROUPS_H_
#define LOCKSTEP_COLLECTIVES_RANK_GROUPS_H_

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "collectives/topology.h"

namespace lockstep {
namespace collectives {

// One rank's world and its TP, CP, DP and TP x CP groups under a Topology (see the top of this
// file).
class RankGroups {
 public:
  // Makes the rank's groups of `world` under `topology`. kInvalidArgument when the topology's
  // world size is not the world's size (naming both); a NewGroup error as it comes.
  static absl::StatusOr<RankGroups> Create(std::shared_ptr<Communicator> world,
                                           const Topology& topology);

  // As Create, over a world the caller owns (a FakeWorld's member, a world passed by reference).
  // Precondition: `world` outlives the RankGroups and every group handed out from it.
  static absl::StatusOr<RankGroups> CreateBorrowing(Communicator& world, const Topology& topology);

  // The world, for a program that shares it; `world()` is never null.
  Communicator& world() const { return *world_; }
  // The world as shared; it owns nothing when made by CreateBorrowing.
  const std::shared_ptr<Communicator>& shared_world() const { return world_; }
  // The topology the groups were made under.
  const Topology& topology() const { return topology_; }
  // This rank's global rank and its coordinates in the topology.
  int rank() const { return world_->rank(); }
  // This rank's coordinates in the topology.
  const Coordinates& coordinates() const { return coordinates_; }

  // The rank's groups, always made (a group of one where its dimension has size 1).

  // The TP group (Topology::TpGroup), never null.
  const std::shared_ptr<Communicator>& tp() const { return tp_; }
  // The CP group (Topology::CpGroup), never null.
  const std::shared_ptr<Communicator>& cp() const { return cp_; }
  // The DP group (Topology::DpGroup), never null.
  const std::shared_ptr<Communicator>& dp() const { return dp_; }
  // The TP x CP group (Topology::TpCpGroup): this rank and its replicas, never null.
  const std::shared_ptr<Communicator>& tp_cp() const { return tp_cp_; }

  // The group each dimension's collectives run over, or nullptr when it has no other member
  // (Note [A group of one is no group]).

  // The TP group, or nullptr at TP 1: what TP collectives run over.
  Communicator* tp_or_null() const { return WithOthers(tp_.get()); }
  // The CP group, or nullptr at CP 1: what CP collectives run over.
  Communicator* cp_or_null() const { return WithOthers(cp_.get()); }
  // The DP group, or nullptr at DP 1: what DP collectives (gradient reduction) run over.
  Communicator* dp_or_null() const { return WithOthers(dp_.get()); }

  // The ranks that hold replicas of this rank's model-stream draws and receive the same
  // microbatch outputs: the TP x CP group, or nullptr when it is this rank alone.
  Communicator* replicas() const { return WithOthers(tp_cp_.get()); }

  // The leader of this rank's TP x CP group (its first global rank): the rank whose draws and
  // digests the replicas compare against.
  int replica_leader() const { return tp_cp_->global_ranks().front(); }

 private:
  RankGroups(std::shared_ptr<Communicator> world, const Topology& topology, Coordinates me)
      : world_(std::move(world)), topology_(topology), coordinates_(me) {}

  std::shared_ptr<Communicator> world_;
  Topology topology_;
  Coordinates coordinates_;
  std::shared_ptr<Communicator> tp_, cp_, dp_, tp_cp_;
};

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_RANK_GROUPS_H_
