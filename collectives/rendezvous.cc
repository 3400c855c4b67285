#include "collectives/rendezvous.h"

#include <netdb.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "collectives/internal/store.h"
#include "collectives/internal/store_probe.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"

namespace lockstep {
namespace collectives {

namespace {

using Clock = std::chrono::steady_clock;

// Note [Bounded start-up]: every wait of Tcp() and File() ends within the caller's timeout (plus
// kStartUpGrace) whatever the peer at the store's address does, since a wait that never ends
// hangs a whole job at launch with nothing to say why. Two parts:
//  - Before LibTorch's TCPStore client touches MASTER_ADDR:MASTER_PORT, a rank other than 0
//    probes it with one store query of its own over a plain socket, every step under the deadline
//    (internal::ProbeStore, store_probe.h). LibTorch cannot be trusted with that first contact:
//    its 1.13 client waits for replies without any bound, and its background callback thread reads
//    whatever the peer sends and lets the exception from a garbage length prefix (std::bad_alloc)
//    end the process — no CallTorch can catch it there. A peer that never answers is
//    kDeadlineExceeded; one that answers something else is kFailedPrecondition ("did not answer as
//    a c10d store").
//  - A peer that answered the probe can still stop answering later (its process stopped, its
//    host overloaded), and LibTorch's store calls (1.13's check(), its connects) take no deadline.
//    So the store's construction and the arrivals run on a helper thread (RunStartUp) that the
//    caller waits for until the deadline plus kStartUpGrace, then gives up on: the thread is
//    detached, holding (through a shared_ptr) the store and everything else it touches, and ends
//    on its own when its call returns or fails. The leak is one blocked thread and one socket
//    per abandoned start-up, in a process that is about to report the failure and exit.
constexpr absl::Duration kStartUpGrace = absl::Seconds(2);

// What a start-up thread is doing, and then what it produced (Note [Bounded start-up]).
struct StartUp {
  std::mutex mu;
  std::condition_variable cv;
  std::string phase = "starting";
  bool done = false;
  absl::StatusOr<std::unique_ptr<Rendezvous::Impl>> result;

  void Enter(std::string what) {
    std::lock_guard<std::mutex> lock(mu);
    phase = std::move(what);
  }
};

// Runs `work` on a helper thread and returns its result, or gives up on it once `deadline` plus
// kStartUpGrace has passed: kDeadlineExceeded naming `store` and the phase the work was in. The
// grace lets the work report a timeout of its own (which names the missing ranks) first. `work`
// must own (capture by value) whatever it uses besides the StartUp it is given.
absl::StatusOr<std::unique_ptr<Rendezvous::Impl>> RunStartUp(
    const std::string& where, const std::string& store, absl::Duration timeout,
    Clock::time_point deadline,
    std::function<absl::StatusOr<std::unique_ptr<Rendezvous::Impl>>(StartUp&)> work) {
  auto state = std::make_shared<StartUp>();
  std::thread thread;
  try {
    thread = std::thread([state, work = std::move(work)] {
      absl::StatusOr<std::unique_ptr<Rendezvous::Impl>> result = work(*state);
      std::lock_guard<std::mutex> lock(state->mu);
      state->result = std::move(result);
      state->done = true;
      state->cv.notify_all();
    });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(where, ": cannot start the rendezvous thread: ", e.what()));
  }
  std::unique_lock<std::mutex> lock(state->mu);
  if (!state->cv.wait_until(lock, deadline + absl::ToChronoMilliseconds(kStartUpGrace),
                            [&state] { return state->done; })) {
    const std::string phase = state->phase;
    lock.unlock();
    thread.detach();
    return absl::DeadlineExceededError(absl::StrCat(
        where, ": the store at ", store, " did not answer within ", absl::FormatDuration(timeout),
        " while ", phase,
        "; its server (global rank 0) is stopped or overloaded, or the link to it is down"));
  }
  absl::StatusOr<std::unique_ptr<Rendezvous::Impl>> result = std::move(state->result);
  lock.unlock();
  thread.join();
  return result;
}

// Note [The store's address]: rank 0's store is given a socket bound to MASTER_ADDR where
// LibTorch takes one and MASTER_ADDR is a numeric address of this machine; elsewhere it listens
// on every interface as LibTorch's does (docs/multihost.md says how to restrict it). Returns the
// socket given (-1: none), which the store owns once it is made.
int SetListeningSocket(int rank, const std::string& host, int port,
                       c10d::TCPStoreOptions& options) {
  if (rank != 0 || !internal::StoreTakesASocket()) return -1;
#if __has_include("torch/headeronly/version.h")
  absl::StatusOr<int> fd = internal::ListenOnStoreAddress(host, port);
  if (fd.ok()) {
    options.masterListenFd = *fd;
    return *fd;
  }
  if (!absl::StrContains(fd.status().message(), "not a numeric address")) {
    LOCKSTEP_LOG(WARNING) << "the rendezvous store is left to listen as LibTorch does: "
                          << fd.status().message();
  }
#else
  (void)host;
  (void)port;
  (void)options;
#endif
  return -1;
}

// Closes `fd` (SetListeningSocket's) after the store failed to start, unless the store closed it
// already and the number now names another file.
void CloseUnlessTaken(int fd, ino_t inode) {
  struct stat info;
  if (fd >= 0 && fstat(fd, &info) == 0 && info.st_ino == inode) close(fd);
}

// Runs a store operation through the exception boundary. A failure of the transport or of the
// store (kUnavailable, or kInternal where the store throws plain errors, as LibTorch 1.13's do)
// that comes once `timeout` has passed is a peer that did not arrive in time: kDeadlineExceeded.
template <typename Fn>
absl::Status StoreCall(const std::string& what, absl::Duration timeout, Fn&& fn) {
  const absl::Time start = absl::Now();
  absl::Status status = CallTorch(what, std::forward<Fn>(fn));
  const bool transport_or_store = status.code() == absl::StatusCode::kUnavailable ||
                                  status.code() == absl::StatusCode::kInternal;
  if (transport_or_store && absl::Now() - start >= timeout) {
    return absl::DeadlineExceededError(absl::StrCat(status.message(), " (not complete within ",
                                                    absl::FormatDuration(timeout), ")"));
  }
  return status;
}

// Note [Rank claims]: two processes given the same RANK would otherwise both announce it and
// the rendezvous would complete, wrongly, with one process too many. Each process therefore adds
// 1 to its rank's claim counter (the store's add() is atomic) and records who it is under its
// claim's number. The first claimant announces the rank; a later one publishes a marker naming
// the rank and fails. Every rank checks the marker while it waits and once more when all ranks
// are there, so every process still waiting when the second claim comes fails too. A claim that
// comes after the others completed is seen by their heartbeat (StartHeartbeat checks the marker
// with each beat while no claim was seen), and their next collective fails naming it
// (CommunicatorBase::Collective asks ClaimedTwice; a process already waiting in a collective that
// its peers then refuse names it too, when it gives up).
std::string ClaimsKey(int rank) { return absl::StrCat("lockstep/rendezvous/claims/", rank); }
std::string ClaimKey(int rank, int64_t n) {
  return absl::StrCat("lockstep/rendezvous/claim/", rank, "/", n);
}
constexpr char kDuplicateKey[] = "lockstep/rendezvous/duplicate";

// Note [Rank claims]: the error naming the rank given twice (as the marker says) and its
// claimants.
absl::Status DuplicateRankError(c10d::Store& store, absl::Duration timeout,
                                const std::string& where) {
  std::vector<uint8_t> marker;
  LOCKSTEP_RETURN_IF_ERROR(StoreCall(where, timeout, [&] { marker = store.get(kDuplicateKey); }));
  int rank = -1;
  if (!absl::SimpleAtoi(std::string(marker.begin(), marker.end()), &rank)) {
    return absl::InternalError(absl::StrCat(where, ": the duplicate-rank marker is malformed"));
  }
  int64_t claims = 0;
  LOCKSTEP_RETURN_IF_ERROR(
      StoreCall(where, timeout, [&] { claims = store.add(ClaimsKey(rank), 0); }));
  std::vector<std::string> claimants;
  for (int64_t n = 1; n <= claims; ++n) {
    bool recorded = false;
    std::vector<uint8_t> who;
    LOCKSTEP_RETURN_IF_ERROR(StoreCall(where, timeout, [&] {
      recorded = store.check({ClaimKey(rank, n)});
      if (recorded) who = store.get(ClaimKey(rank, n));
    }));
    claimants.push_back(recorded ? std::string(who.begin(), who.end()) : "one not yet recorded");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      where, ": rank ", rank, " is claimed by ", claims, " processes (",
      absl::StrJoin(claimants, "; "),
      "); every process of a job needs a RANK of its own: check the launch's ranks, and that no "
      "process of an earlier run (or its file store) is left"));
}

// Every rank announces itself in the store, then waits for the others' announcements, so that a
// rendezvous that cannot complete fails by `deadline` naming the ranks that arrived and the ones
// that did not (instead of a store error naming neither).
// Each rank announces its host name; with `local_world_size` ranks per node (0: unknown), the
// missing ranks are also named by node (rank / local_world_size, torchrun's numbering), since
// a whole node missing usually means its launch never started or cannot reach the store.
// A rank given to two processes is named (Note [Rank claims]).
absl::Status AwaitArrivals(c10d::Store& store, int rank, int world_size, int local_world_size,
                           absl::Duration timeout, Clock::time_point deadline,
                           const std::string& where, StartUp& progress) {
  auto key = [](int r) { return absl::StrCat("lockstep/rendezvous/arrived/", r); };
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string me = host[0] != '\0' ? host : "?";
  const std::string identity = absl::StrCat("host ", me, " pid ", getpid());
  progress.Enter(absl::StrCat("announcing rank ", rank));
  int64_t claim = 0;
  LOCKSTEP_RETURN_IF_ERROR(StoreCall(absl::StrCat(where, ": announcing rank ", rank), timeout, [&] {
    claim = store.add(ClaimsKey(rank), 1);
    store.set(ClaimKey(rank, claim), std::vector<uint8_t>(identity.begin(), identity.end()));
    if (claim == 1) {
      store.set(key(rank), std::vector<uint8_t>(me.begin(), me.end()));
    } else {
      const std::string marker = std::to_string(rank);
      store.set(kDuplicateKey, std::vector<uint8_t>(marker.begin(), marker.end()));
    }
  }));
  if (claim > 1) return DuplicateRankError(store, timeout, where);
  std::vector<std::string> all;
  for (int r = 0; r < world_size; ++r) all.push_back(key(r));
  progress.Enter("waiting for the other ranks to arrive");
  for (;;) {
    bool complete = false;
    bool duplicate = false;
    const absl::Status waited =
        StoreCall(absl::StrCat(where, ": waiting for the other ranks"), timeout, [&] {
          complete = store.check(all);
          duplicate = store.check({kDuplicateKey});  // after: none, once all are there
        });
    if (!waited.ok() && waited.code() != absl::StatusCode::kDeadlineExceeded) {
      // The store answered before and fails now: its connection is gone, not a peer late.
      return absl::UnavailableError(absl::StrCat(
          waited.message(),
          "; the connection to the rendezvous store was lost: global rank 0, which serves it, "
          "is gone or the link to its host is down"));
    }
    LOCKSTEP_RETURN_IF_ERROR(waited);
    if (duplicate) return DuplicateRankError(store, timeout, where);
    if (complete) return absl::OkStatus();
    if (Clock::now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  progress.Enter("reading which ranks arrived");
  std::vector<int> arrived, missing;
  std::set<std::string> hosts;
  for (int r = 0; r < world_size; ++r) {
    bool here = false;
    LOCKSTEP_RETURN_IF_ERROR(StoreCall(where, timeout, [&] { here = store.check({key(r)}); }));
    (here ? arrived : missing).push_back(r);
    if (here) {
      std::vector<uint8_t> name;
      LOCKSTEP_RETURN_IF_ERROR(StoreCall(where, timeout, [&] { name = store.get(key(r)); }));
      hosts.insert(std::string(name.begin(), name.end()));
    }
  }
  std::string nodes;
  if (local_world_size > 0 && world_size % local_world_size == 0) {
    // A node none of whose ranks came is a launch that never started or cannot reach the store;
    // one with only some ranks missing lost those ranks.
    std::set<int> none, partly;
    for (int r : missing) none.insert(r / local_world_size);
    for (int r : arrived) {
      if (none.erase(r / local_world_size) > 0) partly.insert(r / local_world_size);
    }
    for (int r : missing) {
      if (none.count(r / local_world_size) == 0) partly.insert(r / local_world_size);
    }
    nodes = absl::StrCat(" (", local_world_size, " ranks per node, ", world_size / local_world_size,
                         " nodes)");
    if (!none.empty()) {
      absl::StrAppend(&nodes, "; node(s) ", absl::StrJoin(none, ", "),
                      " sent no rank: their launch did not start or cannot reach the store");
    }
    if (!partly.empty()) {
      absl::StrAppend(&nodes, "; node(s) ", absl::StrJoin(partly, ", "),
                      " came with ranks missing");
    }
  }
  return absl::DeadlineExceededError(absl::StrCat(
      where, ": ", arrived.size(), " of world size ", world_size, " rank(s) arrived ", "within ",
      absl::FormatDuration(timeout), " (", absl::StrJoin(arrived, ", "), ", from host(s) ",
      absl::StrJoin(hosts, ", "), "); missing rank(s) ", absl::StrJoin(missing, ", "), nodes));
}

// The address `host` resolves to, or a clear error (once, instead of c10d's retry warnings).
absl::Status CheckResolvable(const std::string& host, int port) {
  if (host.empty()) {
    return absl::InvalidArgumentError("the rendezvous host (MASTER_ADDR) is empty");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (found != nullptr) freeaddrinfo(found);
  if (error != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve the rendezvous host '", host,
                                                   "' (MASTER_ADDR): ", gai_strerror(error)));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ParseInt(const char* name, const std::optional<std::string>& value, int lo,
                             int hi, std::optional<int> fallback) {
  if (!value.has_value() || value->empty()) {
    if (fallback.has_value()) return *fallback;
    return absl::InvalidArgumentError(
        absl::StrCat(name,
                     " is not set; the torchrun environment needs MASTER_ADDR, "
                     "MASTER_PORT, RANK and WORLD_SIZE"));
  }
  int parsed = 0;
  if (!absl::SimpleAtoi(*value, &parsed) || parsed < lo || parsed > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=", *value, " is not an integer in [", lo, ", ", hi, "]"));
  }
  return parsed;
}

void CheckRanks(int rank, int world_size, absl::Status* status) {
  if (world_size <= 0) {
    *status =
        absl::InvalidArgumentError(absl::StrCat("world size ", world_size, " must be positive"));
  } else if (rank < 0 || rank >= world_size) {
    *status = absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside [0, ", world_size, ")"));
  }
}

}  // namespace

absl::StatusOr<LaunchEnvironment> ParseLaunchEnvironment(
    const std::function<std::optional<std::string>(const char*)>& lookup) {
  LaunchEnvironment env;
  std::optional<std::string> addr = lookup("MASTER_ADDR");
  if (!addr.has_value() || addr->empty()) {
    return absl::InvalidArgumentError(
        "MASTER_ADDR is not set; the torchrun environment needs MASTER_ADDR, MASTER_PORT, RANK "
        "and WORLD_SIZE");
  }
  env.master_addr = *addr;
  absl::StatusOr<int> port = ParseInt("MASTER_PORT", lookup("MASTER_PORT"), 1, 65535, {});
  if (!port.ok()) return port.status();
  absl::StatusOr<int> world = ParseInt("WORLD_SIZE", lookup("WORLD_SIZE"), 1, 1 << 20, {});
  if (!world.ok()) return world.status();
  absl::StatusOr<int> rank = ParseInt("RANK", lookup("RANK"), 0, 1 << 20, {});
  if (!rank.ok()) return rank.status();
  if (*rank >= *world) {
    return absl::InvalidArgumentError(
        absl::StrCat("RANK=", *rank, " is not below WORLD_SIZE=", *world));
  }
  absl::StatusOr<int> local = ParseInt("LOCAL_RANK", lookup("LOCAL_RANK"), 0, 1 << 20, 0);
  if (!local.ok()) return local.status();
  absl::StatusOr<int> per_node =
      ParseInt("LOCAL_WORLD_SIZE", lookup("LOCAL_WORLD_SIZE"), 1, 1 << 20, 0);
  if (!per_node.ok()) return per_node.status();
  if (*per_node > 0 && *local >= *per_node) {
    return absl::InvalidArgumentError(absl::StrCat("LOCAL_RANK=", *local,
                                                   " is not below LOCAL_WORLD_SIZE=", *per_node,
                                                   " (LOCAL_RANK picks this process's GPU)"));
  }
  env.local_world_size = *per_node;
  env.master_port = *port;
  env.world_size = *world;
  env.rank = *rank;
  env.local_rank = *local;
  return env;
}

absl::StatusOr<LaunchEnvironment> LaunchEnvironmentFromProcess() {
  return ParseLaunchEnvironment([](const char* name) -> std::optional<std::string> {
    const char* value = std::getenv(name);
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
}

Rendezvous::Rendezvous(std::unique_ptr<Impl> impl, int rank, int world_size, int local_rank,
                       absl::Duration timeout)
    : impl_(std::move(impl)),
      rank_(rank),
      world_size_(world_size),
      local_rank_(local_rank),
      timeout_(timeout) {}

// The heartbeat thread and how to stop it. Shared with the thread, which also holds the store:
// a beat blocked on a store that no longer answers must not hold up the Rendezvous's destruction
// (a failing rank's exit) for a store timeout, so the destructor waits for it briefly and then
// leaves it to finish on its own (Note [Store lost]).
struct Rendezvous::Beat {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  bool done = false;
  absl::Status claimed_twice;  // Note [Rank claims]: a claim that came after the rendezvous
  std::thread thread;
};

Rendezvous::~Rendezvous() {
  if (beat_ == nullptr) return;
  bool done = false;
  {
    std::unique_lock<std::mutex> lock(beat_->mu);
    beat_->stop = true;
    beat_->cv.notify_all();
    done = beat_->cv.wait_for(
        lock, std::chrono::milliseconds(absl::ToInt64Milliseconds(4 * kHeartbeatPeriod)),
        [this] { return beat_->done; });
  }
  if (done) {
    beat_->thread.join();
  } else {
    beat_->thread.detach();
  }
}

void Rendezvous::StartHeartbeat() {
  if (beat_ != nullptr) return;
  beat_ = std::make_shared<Beat>();
  std::shared_ptr<Beat> beat = beat_;
  c10::intrusive_ptr<c10d::Store> store = impl_->store;
  const std::string key = absl::StrCat("lockstep/heartbeat/", rank_);
  const absl::Duration timeout = timeout_;
  beat_->thread = std::thread([beat, store, key, timeout] {
    std::unique_lock<std::mutex> lock(beat->mu);
    while (!beat->stop) {
      const bool told = !beat->claimed_twice.ok();
      lock.unlock();
      // A failing store (its server gone) only means no more beats.
      bool twice = false;
      (void)CallTorch("heartbeat", [&] {
        store->add(key, 1);
        if (!told) twice = store->check({kDuplicateKey});
      });
      // Note [Rank claims]: a claim that comes after the rendezvous completed is named to this
      // process too, by its next collective.
      absl::Status named;
      if (twice) named = DuplicateRankError(*store, timeout, "rendezvous");
      if (twice && !absl::IsFailedPrecondition(named)) {
        named = absl::FailedPreconditionError(absl::StrCat(
            "rendezvous: a rank of this job is claimed by a second process (which, could not be "
            "read: ",
            named.message(), ")"));
      }
      lock.lock();
      if (twice && !named.ok()) beat->claimed_twice = named;
      beat->cv.wait_for(lock,
                        std::chrono::milliseconds(absl::ToInt64Milliseconds(kHeartbeatPeriod)),
                        [&beat] { return beat->stop; });
    }
    beat->done = true;
    beat->cv.notify_all();
  });
}

absl::Status Rendezvous::ClaimedTwice() const {
  if (beat_ == nullptr) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(beat_->mu);
  return beat_->claimed_twice;
}

absl::Status Rendezvous::Guarded(bool store_only, const std::function<absl::Status()>& call) {
  {
    std::lock_guard<std::mutex> lock(lost_mu_);
    if (!lost_.ok()) {
      return absl::UnavailableError(
          absl::StrCat("the rendezvous store was lost earlier (", lost_.message(), ")"));
    }
  }
  absl::Status status = call();
  if (!status.ok() && store_only) {
    std::lock_guard<std::mutex> lock(lost_mu_);
    if (lost_.ok()) lost_ = status;
  }
  return status;
}

absl::StatusOr<int64_t> Rendezvous::Heartbeat(int rank) {
  int64_t beats = 0;
  absl::Status status = Guarded(true, [&] {
    return StoreCall(absl::StrCat("reading the heartbeat of rank ", rank), timeout_, [&] {
      beats = impl_->store->add(absl::StrCat("lockstep/heartbeat/", rank), 0);
    });
  });
  if (!status.ok()) return status;
  return beats;
}

absl::StatusOr<std::shared_ptr<Rendezvous>> Rendezvous::File(const std::string& path, int rank,
                                                             int world_size,
                                                             absl::Duration timeout) {
  absl::Status valid;
  CheckRanks(rank, world_size, &valid);
  if (!valid.ok()) return valid;
  const std::string where = absl::StrCat("rendezvous through the file store ", path);
  const Clock::time_point deadline = Clock::now() + absl::ToChronoMilliseconds(timeout);
  absl::StatusOr<std::unique_ptr<Impl>> impl =
      RunStartUp(where, path, timeout, deadline,
                 [path, rank, world_size, timeout, deadline,
                  where](StartUp& progress) -> absl::StatusOr<std::unique_ptr<Impl>> {
                   progress.Enter("opening it");
                   auto impl = std::make_unique<Impl>();
                   LOCKSTEP_RETURN_IF_ERROR(
                       StoreCall(absl::StrCat("opening the file store ", path), timeout, [&] {
                         impl->store = c10::make_intrusive<c10d::FileStore>(path, world_size);
                         impl->store->setTimeout(internal::ToChrono(timeout));
                       }));
                   LOCKSTEP_RETURN_IF_ERROR(AwaitArrivals(*impl->store, rank, world_size,
                                                          /*local_world_size=*/0, timeout, deadline,
                                                          where, progress));
                   return impl;
                 });
  if (!impl.ok()) return impl.status();
  return std::shared_ptr<Rendezvous>(
      new Rendezvous(std::move(*impl), rank, world_size, /*local_rank=*/0, timeout));
}

absl::StatusOr<std::shared_ptr<Rendezvous>> Rendezvous::OverStore(std::unique_ptr<Impl> impl,
                                                                  int rank, int world_size,
                                                                  absl::Duration timeout) {
  absl::Status valid;
  CheckRanks(rank, world_size, &valid);
  if (!valid.ok()) return valid;
  if (impl == nullptr || !impl->store) {
    return absl::InvalidArgumentError("a rendezvous over a store: the store is null");
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("a rendezvous over a store: timeout ",
                                                   absl::FormatDuration(timeout), " <= 0"));
  }
  return std::shared_ptr<Rendezvous>(
      new Rendezvous(std::move(impl), rank, world_size, /*local_rank=*/0, timeout));
}

absl::StatusOr<std::shared_ptr<Rendezvous>> Rendezvous::Tcp(const std::string& host, int port,
                                                            int rank, int world_size,
                                                            absl::Duration timeout, int local_rank,
                                                            int local_world_size) {
  absl::Status valid;
  CheckRanks(rank, world_size, &valid);
  if (!valid.ok()) return valid;
  if (port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port ", port, " is outside [1, 65535]"));
  }
  LOCKSTEP_RETURN_IF_ERROR(CheckResolvable(host, port));
  const Clock::time_point deadline = Clock::now() + absl::ToChronoMilliseconds(timeout);
  const std::string address = absl::StrCat(host, ":", port);
  const std::string where =
      absl::StrCat("rendezvous at ", address, " as rank ", rank, " of ", world_size);
  const std::string joining =
      absl::StrCat("joining the TCP store at ", address, " as rank ", rank, " of ", world_size);
  if (rank != 0) {  // Note [Bounded start-up]: rank 0 serves the store itself
    const absl::Status probed = internal::ProbeStore(host, port, timeout, deadline);
    if (!probed.ok()) {
      return absl::Status(probed.code(), absl::StrCat(where, ": ", probed.message()));
    }
  }
  absl::StatusOr<std::unique_ptr<Impl>> impl = RunStartUp(
      where, address, timeout, deadline,
      [host, port, rank, world_size, local_world_size, timeout, deadline, where,
       joining](StartUp& progress) -> absl::StatusOr<std::unique_ptr<Impl>> {
        progress.Enter(rank == 0 ? "starting it" : "connecting to it");
        auto impl = std::make_unique<Impl>();
        LOCKSTEP_RETURN_IF_ERROR(StoreCall(joining, timeout, [&] {
          c10d::TCPStoreOptions options;
          options.port = static_cast<uint16_t>(port);
          options.isServer = rank == 0;
          options.numWorkers = world_size;
          // Arrivals are awaited below, naming who is missing.
          options.waitWorkers = false;
          options.timeout = internal::ToChrono(timeout);
          // Note [The store's address]: the store listens on MASTER_ADDR only, where it can.
          const int fd = SetListeningSocket(rank, host, port, options);
          struct stat socket_info {};
          if (fd >= 0) fstat(fd, &socket_info);
          try {
            impl->store = c10::make_intrusive<c10d::TCPStore>(host, options);
          } catch (...) {
            CloseUnlessTaken(fd, socket_info.st_ino);
            throw;
          }
        }));
        LOCKSTEP_RETURN_IF_ERROR(AwaitArrivals(*impl->store, rank, world_size, local_world_size,
                                               timeout, deadline, where, progress));
        return impl;
      });
  if (!impl.ok()) return impl.status();
  std::shared_ptr<Rendezvous> rendezvous(
      new Rendezvous(std::move(*impl), rank, world_size, local_rank, timeout));
  rendezvous->store_host_ = host;
  rendezvous->store_port_ = port;
  return rendezvous;
}

absl::StatusOr<std::shared_ptr<Rendezvous>> Rendezvous::FromEnvironment(absl::Duration timeout) {
  absl::StatusOr<LaunchEnvironment> env = LaunchEnvironmentFromProcess();
  if (!env.ok()) return env.status();
  return Tcp(env->master_addr, env->master_port, env->rank, env->world_size, timeout,
             env->local_rank, env->local_world_size);
}

absl::Status Rendezvous::Set(const std::string& key, absl::string_view value) {
  return Guarded(true, [&] {
    return StoreCall(absl::StrCat("setting rendezvous key ", key), timeout_, [&] {
      impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
    });
  });
}

absl::StatusOr<bool> Rendezvous::Check(const std::string& key) {
  bool found = false;
  absl::Status status = Guarded(true, [&] {
    return StoreCall(absl::StrCat("checking rendezvous key ", key), timeout_,
                     [&] { found = impl_->store->check({key}); });
  });
  if (!status.ok()) return status;
  return found;
}

// Note [Waits poll]: a store's own wait cannot be abandoned cleanly. On LibTorch 1.13 a TCPStore
// client whose wait timed out stays registered as a waiter on the server, which answers it when
// the key is set later; that stray answer is read as the reply to the connection's next query,
// so later waits return at once and later gets read another query's reply (an adoption retried
// after a timeout then "connected" a host lane its peer never joined), or wait on the store's
// own timeout (30 minutes for torch.distributed's default store). So Get never waits inside the
// store: it asks whether the key is set (a query answered at once) until it is or the caller's
// timeout has passed, and reads it only once it is there.
absl::StatusOr<std::string> Rendezvous::Get(const std::string& key) {
  const absl::Time deadline = absl::Now() + timeout_;
  absl::Duration pause = absl::Microseconds(50);
  for (;;) {
    absl::StatusOr<bool> found = Check(key);
    if (!found.ok()) return found.status();
    if (*found) break;
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("waited ", absl::FormatDuration(timeout_),
                                                      " for rendezvous key ", key,
                                                      ": no rank set it"));
    }
    absl::SleepFor(std::min(pause, deadline - now));
    pause = std::min(pause * 2, absl::Milliseconds(10));
  }
  std::vector<uint8_t> bytes;
  LOCKSTEP_RETURN_IF_ERROR(Guarded(true, [&] {
    return StoreCall(absl::StrCat("reading rendezvous key ", key), timeout_,
                     [&] { bytes = impl_->store->get(key); });
  }));
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace collectives
}  // namespace lockstep
