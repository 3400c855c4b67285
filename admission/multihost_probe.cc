// multihost_probe: a rank of the multi-host tests (admission/multihost_test.sh), started by
// tools/launch on each namespaced host. It joins the world from the torchrun environment over
// Gloo, says where it runs and whether the host lane connects for the group of its node's ranks
// and for the group of the ranks with its local rank on every node (which spans the nodes), then
// runs world all-reduces for --seconds, checking each sum, and reports. Exit 0: every collective
// right; 1: an error, printed with the rank (the multi-host faults' tests read it).
//
// With --ledger_dir each rank plays a DP rank that keeps a recovery ledger (admission/ledger.h):
// every all-reduce round is a step of one microbatch, begun, started, completed once its sum is
// checked, and committed; an error names the last step committed, which the tests compare with
// what the surviving ledger replays to.

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "admission/ledger.h"
#include "base/status_macros.h"
#include "base/tool_flags.h"
#include "collectives/gloo_communicator.h"
#include "collectives/internal/host_lane.h"
#include "collectives/rendezvous.h"

ABSL_FLAG(int, seconds, 0, "how long to keep running all-reduces after setting up");
ABSL_FLAG(int, timeout_seconds, 10, "the rendezvous's and every collective's timeout");
ABSL_FLAG(std::string, ledger_dir, "",
          "where each rank keeps its recovery ledger ledger.rank<R>.db (none when empty)");

namespace lockstep {
namespace {

// A rank's ledger of its rounds: round K is step K, one microbatch of the rank's 1024 tokens.
class RoundLedger {
 public:
  static absl::StatusOr<RoundLedger> Open(const std::string& dir, int rank) {
    RoundLedger ledger;
    if (dir.empty()) return ledger;
    LOCKSTEP_ASSIGN_OR_RETURN(ledger.ledger_, admission::Ledger::OpenWriter(
                                                  absl::StrCat(dir, "/ledger.rank", rank, ".db"),
                                                  admission::LedgerOptions::Of(rank)));
    ledger.ranges_ = {admission::TokenRange{rank, 0, 1024}};
    return ledger;
  }
  absl::Status Begin(int64_t round) {
    if (ledger_ == nullptr) return absl::OkStatus();
    LOCKSTEP_RETURN_IF_ERROR(
        ledger_->BeginStep(round, {admission::PlannedMicrobatch::Of("0", ranges_)}));
    return Record(admission::LedgerEventKind::kStarted, round);
  }
  absl::Status Commit(int64_t round) {
    if (ledger_ == nullptr) return absl::OkStatus();
    LOCKSTEP_RETURN_IF_ERROR(Record(admission::LedgerEventKind::kCompleted, round));
    LOCKSTEP_RETURN_IF_ERROR(ledger_->CommitStep(round));
    last_committed_ = round;
    return absl::OkStatus();
  }
  int64_t last_committed() const { return last_committed_; }

 private:
  absl::Status Record(admission::LedgerEventKind kind, int64_t round) {
    return ledger_->Record(admission::LedgerEvent::Of(kind, round, "0", ranges_)).status();
  }
  std::unique_ptr<admission::Ledger> ledger_;
  std::vector<admission::TokenRange> ranges_;
  int64_t last_committed_ = -1;
};

absl::Status Probe(int64_t& last_committed) {
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
  LOCKSTEP_ASSIGN_OR_RETURN(RoundLedger ledger,
                            RoundLedger::Open(absl::GetFlag(FLAGS_ledger_dir), env.rank));
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::cout << "rank " << env.rank << " on " << host
            << ": lane within node: " << (within != nullptr ? "yes" : "no")
            << "; lane across nodes: " << (across != nullptr ? "yes" : "no") << std::endl;
  const absl::Time end = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  int64_t rounds = 0;
  std::vector<absl::Duration> times;
  // Rank 0's clock decides when to stop, carried in the last element, so every rank runs the
  // same collectives.
  for (bool more = true; more;) {
    at::Tensor t = at::full({1024}, env.rank + 1, at::kDouble);
    t[1023] = env.rank == 0 && absl::Now() < end ? 1.0 : 0.0;
    LOCKSTEP_RETURN_IF_ERROR(ledger.Begin(rounds));
    const absl::Time before = absl::Now();
    LOCKSTEP_RETURN_IF_ERROR(world->AllReduceSum(t));
    times.push_back(absl::Now() - before);
    const double want = env.world_size * (env.world_size + 1) / 2.0;
    if (t[0].item<double>() != want) {
      return absl::DataLossError(
          absl::StrCat("all-reduce ", rounds, " gave ", t[0].item<double>(), ", expected ", want));
    }
    LOCKSTEP_RETURN_IF_ERROR(ledger.Commit(rounds));
    last_committed = ledger.last_committed();
    more = t[1023].item<double>() > 0;
    ++rounds;
  }
  LOCKSTEP_RETURN_IF_ERROR(world->Barrier());
  std::sort(times.begin(), times.end());
  std::cout << "rank " << env.rank << ": ok after " << rounds << " all-reduces (8 KiB, median "
            << absl::ToDoubleMicroseconds(times[times.size() / 2]) << " us)" << std::endl;
  return absl::OkStatus();
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  lockstep::ParseToolFlags(argc, argv,
                           "multihost_probe [--seconds=S]: a rank of the multi-host tests");
  at::set_num_threads(1);
  int64_t last_committed = -1;
  const absl::Status status = lockstep::Probe(last_committed);
  if (!status.ok()) {
    const char* rank = std::getenv("RANK");
    std::cout << "probe error (rank " << (rank != nullptr ? rank : "?") << "): " << status
              << " (last committed step " << last_committed << ")" << std::endl;
    return 1;
  }
  return 0;
}
