// multihost_probe: a rank of the multi-host tests (collectives/multihost_test.sh), started by
// tools/launch on each namespaced host. It joins the world from the torchrun environment over
// Gloo, says where it runs and whether the host lane connects for the group of its node's ranks
// and for the group of the ranks with its local rank on every node (which spans the nodes), then
// runs world all-reduces for --seconds, checking each sum, and reports. Exit 0: every collective
// right; 1: an error, printed with the rank (the multi-host faults' tests read it).

#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "base/tool_flags.h"
#include "collectives/gloo_communicator.h"
#include "collectives/internal/host_lane.h"
#include "collectives/rendezvous.h"

ABSL_FLAG(int, seconds, 0, "how long to keep running all-reduces after setting up");
ABSL_FLAG(int, timeout_seconds, 10, "the rendezvous's and every collective's timeout");

namespace lockstep {
namespace {

absl::Status Probe() {
  const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds));
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::LaunchEnvironment env,
                            collectives::LaunchEnvironmentFromProcess());
  LOCKSTEP_ASSIGN_OR_RETURN(auto rendezvous, collectives::Rendezvous::FromEnvironment(timeout));
  collectives::GlooCommunicator::Options options;
  options.timeout = timeout;
  LOCKSTEP_ASSIGN_OR_RETURN(auto world, collectives::GlooCommunicator::Create(rendezvous, options));
  const int per_node = env.local_world_size > 0 ? env.local_world_size : env.world_size;
  const int node = env.rank / per_node, nodes = env.world_size / per_node;
  LOCKSTEP_ASSIGN_OR_RETURN(auto within, collectives::internal::HostLane::Connect(
                                             *rendezvous, absl::StrCat("probe/node", node),
                                             env.local_rank, per_node, timeout));
  LOCKSTEP_ASSIGN_OR_RETURN(
      auto across,
      collectives::internal::HostLane::Connect(
          *rendezvous, absl::StrCat("probe/local", env.local_rank), node, nodes, timeout));
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::cout << "rank " << env.rank << " on " << host
            << ": lane within node: " << (within != nullptr ? "yes" : "no")
            << "; lane across nodes: " << (across != nullptr ? "yes" : "no") << std::endl;
  const absl::Time end = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  int64_t rounds = 0;
  // Rank 0's clock decides when to stop, carried in the last element, so every rank runs the
  // same collectives.
  for (bool more = true; more;) {
    at::Tensor t = at::full({1024}, env.rank + 1, at::kDouble);
    t[1023] = env.rank == 0 && absl::Now() < end ? 1.0 : 0.0;
    LOCKSTEP_RETURN_IF_ERROR(world->AllReduceSum(t));
    const double want = env.world_size * (env.world_size + 1) / 2.0;
    if (t[0].item<double>() != want) {
      return absl::DataLossError(
          absl::StrCat("all-reduce ", rounds, " gave ", t[0].item<double>(), ", expected ", want));
    }
    more = t[1023].item<double>() > 0;
    ++rounds;
  }
  LOCKSTEP_RETURN_IF_ERROR(world->Barrier());
  std::cout << "rank " << env.rank << ": ok after " << rounds << " all-reduces" << std::endl;
  return absl::OkStatus();
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  lockstep::ParseToolFlags(argc, argv,
                           "multihost_probe [--seconds=S]: a rank of the multi-host tests");
  at::set_num_threads(1);
  const absl::Status status = lockstep::Probe();
  if (!status.ok()) {
    std::cout << "probe error: " << status << std::endl;
    return 1;
  }
  return 0;
}
