// collectives/rendezvous.h
//
// Rendezvous is how the processes of one job find each other before any communicator exists:
// a key-value store (c10d's TCPStore or FileStore) shared by the job's ranks, plus each
// process's rank, world size and local rank. Communicators (Gloo, NCCL) are built on top of it.
//
// FromEnvironment() reads the torchrun convention, so torchrun, tools/launch and cluster
// launchers that export the same variables work unchanged:
//   MASTER_ADDR  host of rank 0's TCP store          (required)
//   MASTER_PORT  its port, 1..65535                  (required)
//   RANK         this process's global rank          (required, 0 <= RANK < WORLD_SIZE)
//   WORLD_SIZE   number of processes                 (required, positive)
//   LOCAL_RANK   rank on this host, selects the GPU  (optional, default 0;
//                                                     below LOCAL_WORLD_SIZE when that is given)
//   LOCAL_WORLD_SIZE  ranks per host                 (optional; names missing nodes)
// Rank 0 serves the TCP store; every rank announces itself (and its host name) in the store and
// waits up to the timeout for all the others, then fails with kDeadlineExceeded naming the
// address, the world size, the ranks that arrived and their hosts, and the ones missing — with
// LOCAL_WORLD_SIZE also the nodes they belong to (rank / LOCAL_WORLD_SIZE, as launch and torchrun
// number them). An address that does not resolve is kInvalidArgument at once.
//
// Hostile or broken peers (Note [Bounded start-up] in rendezvous.cc):
//  - Tcp() and File() return within the timeout plus 2 s whatever the store's peer does: a
//    listener at MASTER_PORT that never answers, or a store that stops answering midway, is
//    kDeadlineExceeded naming host:port and what was being waited for. A call into LibTorch that
//    blocks past that is abandoned on a helper thread, which ends on its own later.
//  - A rank other than 0 checks with one store query of its own that host:port answers as a c10d
//    store before LibTorch's client touches it; anything else there (wrong service, garbage) is
//    kFailedPrecondition "... host:port did not answer as a c10d store", never an abort.
//  - The same rank claimed by two processes (Note [Rank claims]) is kFailedPrecondition naming the
//    rank and each claimant's host and pid, for the second claimant always, for every process
//    still waiting in the rendezvous when the second claim comes, and for a process whose
//    rendezvous had completed at its next collective once its heartbeat has seen the claim.
//
// Thread-safety: Set/Get are thread-safe (the stores are).
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(auto rendezvous, Rendezvous::FromEnvironment(absl::Seconds(60)));
//   LOCKSTEP_ASSIGN_OR_RETURN(auto world, GlooCommunicator::Create(rendezvous, {}));

#ifndef LOCKSTEP_COLLECTIVES_RENDEZVOUS_H_
#define LOCKSTEP_COLLECTIVES_RENDEZVOUS_H_

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace lockstep {
namespace collectives {

// The torchrun variables, parsed and validated.
struct LaunchEnvironment {
  std::string master_addr;   // MASTER_ADDR: host of rank 0's TCP store, non-empty
  int master_port = 0;       // MASTER_PORT: its port, 1..65535
  int rank = 0;              // RANK: this process's global rank, in [0, world_size)
  int world_size = 0;        // WORLD_SIZE: number of processes, positive
  int local_rank = 0;        // LOCAL_RANK: rank on this host (selects the GPU); default 0
  int local_world_size = 0;  // LOCAL_WORLD_SIZE: ranks per host; 0: not given
};

// Parses the variables through `lookup` (nullopt for an unset variable). kInvalidArgument names
// the variable, its value and the expected range (for RANK and LOCAL_RANK, also the variable they
// must stay below).
absl::StatusOr<LaunchEnvironment> ParseLaunchEnvironment(
    const std::function<std::optional<std::string>(const char*)>& lookup);

// ParseLaunchEnvironment over the process environment.
absl::StatusOr<LaunchEnvironment> LaunchEnvironmentFromProcess();

// The job's shared key-value store plus this process's rank, world size and local rank (see the
// top of this file).
class Rendezvous {
 public:
  // A FileStore at `path` (a file on a filesystem every rank sees; created if absent). A file
  // left by an earlier run of the job makes its ranks look claimed twice: use a fresh path.
  static absl::StatusOr<std::shared_ptr<Rendezvous>> File(const std::string& path, int rank,
                                                          int world_size, absl::Duration timeout);
  // A TCPStore served by rank 0 at host:port; `local_world_size` ranks per node (0: unknown)
  // names the missing nodes when the rendezvous cannot complete.
  static absl::StatusOr<std::shared_ptr<Rendezvous>> Tcp(const std::string& host, int port,
                                                         int rank, int world_size,
                                                         absl::Duration timeout, int local_rank = 0,
                                                         int local_world_size = 0);
  // Tcp() with the torchrun variables (see the top of this file).
  static absl::StatusOr<std::shared_ptr<Rendezvous>> FromEnvironment(absl::Duration timeout);

  ~Rendezvous();

  // This process's global rank, in [0, world_size()).
  int rank() const { return rank_; }
  // Number of processes in the job.
  int world_size() const { return world_size_; }
  // This process's rank on its host (LOCAL_RANK; 0 for File and OverStore).
  int local_rank() const { return local_rank_; }
  // The TCP store's host and port as given (MASTER_ADDR); empty and 0 for other stores.
  const std::string& store_host() const { return store_host_; }
  // The TCP store's port (MASTER_PORT); 0 for other stores.
  int store_port() const { return store_port_; }
  // The timeout it was made with: how long the rendezvous, each store call and Get wait.
  absl::Duration timeout() const { return timeout_; }

  // Stores `value` under `key` for every rank to read.
  absl::Status Set(const std::string& key, absl::string_view value);
  // Waits up to timeout() for `key` to be set, then returns its value (Note [Waits poll]:
  // kDeadlineExceeded naming the key when no rank set it in time).
  absl::StatusOr<std::string> Get(const std::string& key);
  // Whether `key` is set, without waiting.
  absl::StatusOr<bool> Check(const std::string& key);
  // Note [Store lost]: Set, Check and Heartbeat need no peer, only the store, so their failure
  // means the store (rank 0's process or the link to its host) is gone. The first such failure
  // is kept: every later Set, Check, Get and Heartbeat returns kUnavailable at once, naming it,
  // instead of waiting out another timeout on a connection that cannot answer (a rank reporting
  // an error after losing its store would otherwise take one timeout per store call). Get's own
  // timeout (a key never set) is a peer late, not a store lost, and is not kept.

  // Liveness (Note [Roll call] in collectives/internal/communicator_base.h): once started, a
  // thread of this process adds 1 to its counter "lockstep/heartbeat/<rank>" every
  // kHeartbeatPeriod until the Rendezvous is destroyed; a process that dies or is stopped stops
  // counting. StartHeartbeat is idempotent; communicators start it. Heartbeat(r) reads rank r's
  // counter (0 before its first beat).
  static constexpr absl::Duration kHeartbeatPeriod = absl::Milliseconds(250);
  // Starts this process's heartbeat thread, once (later calls do nothing); a failing store only
  // stops the beats.
  void StartHeartbeat();
  // Note [Rank claims] (rendezvous.cc): OK unless the heartbeat saw this job's rank claimed by
  // a second process after the rendezvous completed; then kFailedPrecondition naming the rank
  // and its claimants, which every collective of this process's communicators returns.
  absl::Status ClaimedTwice() const;
  // Rank `rank`'s heartbeat counter, 0 before its first beat. A store that does not answer is an
  // error, kept as the store lost (Note [Store lost]).
  absl::StatusOr<int64_t> Heartbeat(int rank);

  // Implementation detail for communicators in this package (collectives/internal/).
  struct Impl;
  // The store behind this rendezvous, for communicators in this package (collectives/internal/).
  Impl& impl() const { return *impl_; }
  // A rendezvous over a store the program already has (`impl` from collectives/internal/
  // store.h; AdoptedCommunicator::Adopt wraps torch.distributed's). Exchanges nothing: the
  // program's own rendezvous has met every rank. kInvalidArgument for a null store, a rank
  // outside [0, world_size) or a non-positive timeout.
  static absl::StatusOr<std::shared_ptr<Rendezvous>> OverStore(std::unique_ptr<Impl> impl, int rank,
                                                               int world_size,
                                                               absl::Duration timeout);

 private:
  Rendezvous(std::unique_ptr<Impl> impl, int rank, int world_size, int local_rank,
             absl::Duration timeout);

  struct Beat;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<Beat> beat_;
  int rank_;
  int world_size_;
  int local_rank_;
  absl::Duration timeout_;
  std::string store_host_;
  int store_port_ = 0;
  // Note [Store lost]: the first failure of a store-only call; OK while the store answers.
  mutable std::mutex lost_mu_;
  absl::Status lost_;
  // Runs `call` (a StoreCall) unless the store is already lost; keeps its failure as the loss
  // when `store_only`.
  absl::Status Guarded(bool store_only, const std::function<absl::Status()>& call);
};

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_RENDEZVOUS_H_
