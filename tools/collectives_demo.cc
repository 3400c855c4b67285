// collectives_demo: a smoke job for a DP x TP x CP world over Gloo, run under tools/launch.
//
//   launch --nproc=4 -- collectives_demo --tp=1 --cp=2
//
// Every rank joins from the torchrun environment, builds its TP, CP, TP x CP and DP groups, and
// checks that each collective moves the right values: a world all-reduce, a broadcast from
// each group's leader (its global rank, not assumed 0), a DP all-gather and an agreement check
// over the TP x CP group. Prints one line per rank; exits 2 for flags or a launch environment that
// cannot run (before any rendezvous), 1 on any wrong value or error.

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/tool_flags.h"
#include "collectives/agreement.h"
#include "collectives/gloo_communicator.h"
#include "collectives/rank_groups.h"
#include "collectives/rendezvous.h"
#include "collectives/topology.h"

ABSL_FLAG(int, tp, 1, "tensor-parallel size");
ABSL_FLAG(int, cp, 1, "context-parallel size");

namespace lockstep {
namespace {

using collectives::Communicator;
using collectives::Topology;

absl::Status Check(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("wrong result: ", what));
}

// Broadcasts the leader's global rank within `group`; every member must receive it.
absl::Status CheckLeaderBroadcast(Communicator& group, const std::string& name) {
  at::Tensor t =
      at::full({1}, static_cast<double>(group.global_ranks()[group.rank()]), at::kDouble);
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(group.Broadcast(t, 0), "in the " + name + " group");
  return Check(t.item<double>() == group.global_ranks()[0],
               absl::StrCat(name, " broadcast gave ", t.item<double>()));
}

absl::StatusOr<std::string> Run(int tp, int cp) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto rendezvous,
                            collectives::Rendezvous::FromEnvironment(absl::Seconds(60)));
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::shared_ptr<collectives::Communicator> world,
      collectives::GlooCommunicator::Create(rendezvous, collectives::GlooCommunicator::Options()));
  const int rank = world->rank();
  const int n = world->size();
  LOCKSTEP_ASSIGN_OR_RETURN(Topology topo, Topology::Create(n, tp, cp));
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::RankGroups groups,
                            collectives::RankGroups::Create(world, topo));
  const collectives::Coordinates c = groups.coordinates();
  collectives::Communicator* tp_group = groups.tp().get();
  collectives::Communicator* cp_group = groups.cp().get();
  collectives::Communicator* tpcp_group = groups.tp_cp().get();
  collectives::Communicator* dp_group = groups.dp().get();

  at::Tensor sum = at::full({1}, static_cast<double>(rank), at::kDouble);
  LOCKSTEP_RETURN_IF_ERROR(world->AllReduceSum(sum));
  LOCKSTEP_RETURN_IF_ERROR(Check(sum.item<double>() == n * (n - 1) / 2.0, "world all-reduce"));
  LOCKSTEP_RETURN_IF_ERROR(CheckLeaderBroadcast(*tp_group, "TP"));
  LOCKSTEP_RETURN_IF_ERROR(CheckLeaderBroadcast(*cp_group, "CP"));
  LOCKSTEP_RETURN_IF_ERROR(CheckLeaderBroadcast(*tpcp_group, "TPxCP"));
  LOCKSTEP_RETURN_IF_ERROR(CheckLeaderBroadcast(*dp_group, "DP"));
  LOCKSTEP_ASSIGN_OR_RETURN(auto gathered, dp_group->AllGather(at::full({1}, rank, at::kLong)));
  std::vector<int> dp_ranks;
  for (const at::Tensor& g : gathered) dp_ranks.push_back(static_cast<int>(g.item<int64_t>()));
  LOCKSTEP_RETURN_IF_ERROR(Check(dp_ranks == topo.DpGroup(rank), "DP all-gather"));
  LOCKSTEP_RETURN_IF_ERROR(collectives::CheckAgreement(*tpcp_group, "demo", topo.DebugString()));
  LOCKSTEP_RETURN_IF_ERROR(world->Barrier());
  return absl::StrCat("rank ", rank, " of ", topo.DebugString(), " (dp ", c.dp, ", cp ", c.cp,
                      ", tp ", c.tp, "): world all-reduce ok; leaders TP ",
                      tp_group->global_ranks()[0], ", CP ", cp_group->global_ranks()[0], ", TPxCP ",
                      tpcp_group->global_ranks()[0], ", DP ", dp_group->global_ranks()[0],
                      " ok; DP all-gather [", absl::StrJoin(dp_ranks, ", "),
                      "] ok; TPxCP agreement ok");
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  const std::vector<std::string> args = lockstep::ParseToolFlags(
      argc, argv,
      "collectives_demo [--tp=N] [--cp=N]: a smoke job for a DP x TP x CP world over Gloo, run "
      "under tools/launch");
  if (absl::Status s = lockstep::NoPositionalArguments(args); !s.ok()) {
    std::cerr << "collectives_demo: " << s.message() << std::endl;
    return lockstep::kBadInputExitCode;
  }
  // Input that cannot run is refused before any rendezvous (exit 2): the launch environment, and
  // TP and CP sizes that do not split its world.
  const int tp = absl::GetFlag(FLAGS_tp);
  const int cp = absl::GetFlag(FLAGS_cp);
  absl::StatusOr<lockstep::collectives::LaunchEnvironment> environment =
      lockstep::collectives::LaunchEnvironmentFromProcess();
  absl::Status runnable = environment.status();
  if (runnable.ok()) {
    runnable = lockstep::collectives::Topology::Create(environment->world_size, tp, cp).status();
  }
  if (!runnable.ok()) {
    std::cerr << "collectives_demo: " << runnable.message() << std::endl;
    return lockstep::kBadInputExitCode;
  }
  absl::StatusOr<std::string> line = lockstep::Run(tp, cp);
  if (!line.ok()) {
    std::cerr << "FAILED: " << line.status() << std::endl;
    return 1;
  }
  std::cout << line.value() << std::endl;
  return 0;
}
