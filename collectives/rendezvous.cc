#include "collectives/rendezvous.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "collectives/internal/store.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"

namespace lockstep {
namespace collectives {

namespace {

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

// Every rank announces itself in the store, then waits for the others' announcements, so that a
// rendezvous that cannot complete fails within its timeout naming the ranks that arrived and the
// ones that did not (instead of a store error naming neither).
// Each rank announces its host name; with `local_world_size` ranks per node (0: unknown), the
// missing ranks are also named by node (rank / local_world_size, torchrun's numbering), since
// a whole node missing usually means its launch never started or cannot reach the store.
absl::Status AwaitArrivals(c10d::Store& store, int rank, int world_size, int local_world_size,
                           absl::Duration timeout, const std::string& where) {
  auto key = [](int r) { return absl::StrCat("lockstep/rendezvous/arrived/", r); };
  const absl::Time deadline = absl::Now() + timeout;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string me = host[0] != '\0' ? host : "?";
  LOCKSTEP_RETURN_IF_ERROR(StoreCall(absl::StrCat(where, ": announcing rank ", rank), timeout, [&] {
    store.set(key(rank), std::vector<uint8_t>(me.begin(), me.end()));
  }));
  std::vector<std::string> all;
  for (int r = 0; r < world_size; ++r) all.push_back(key(r));
  for (;;) {
    bool complete = false;
    const absl::Status waited = StoreCall(absl::StrCat(where, ": waiting for the other ranks"),
                                          timeout, [&] { complete = store.check(all); });
    if (!waited.ok() && waited.code() != absl::StatusCode::kDeadlineExceeded) {
      // The store answered before and fails now: its connection is gone, not a peer late.
      return absl::UnavailableError(absl::StrCat(
          waited.message(),
          "; the connection to the rendezvous store was lost: global rank 0, which serves it, "
          "is gone or the link to its host is down"));
    }
    LOCKSTEP_RETURN_IF_ERROR(waited);
    if (complete) return absl::OkStatus();
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
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
  beat_->thread = std::thread([beat, store, key] {
    std::unique_lock<std::mutex> lock(beat->mu);
    while (!beat->stop) {
      lock.unlock();
      // A failing store (its server gone) only means no more beats.
      (void)CallTorch("heartbeat", [&] { store->add(key, 1); });
      lock.lock();
      beat->cv.wait_for(lock,
                        std::chrono::milliseconds(absl::ToInt64Milliseconds(kHeartbeatPeriod)),
                        [&beat] { return beat->stop; });
    }
    beat->done = true;
    beat->cv.notify_all();
  });
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
  auto impl = std::make_unique<Impl>();
  const std::string where = absl::StrCat("rendezvous through the file store ", path);
  absl::Status status = StoreCall(absl::StrCat("opening the file store ", path), timeout, [&] {
    impl->store = c10::make_intrusive<c10d::FileStore>(path, world_size);
    impl->store->setTimeout(internal::ToChrono(timeout));
  });
  if (!status.ok()) return status;
  LOCKSTEP_RETURN_IF_ERROR(
      AwaitArrivals(*impl->store, rank, world_size, /*local_world_size=*/0, timeout, where));
  return std::shared_ptr<Rendezvous>(
      new Rendezvous(std::move(impl), rank, world_size, /*local_rank=*/0, timeout));
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
  auto impl = std::make_unique<Impl>();
  const std::string where =
      absl::StrCat("rendezvous at ", host, ":", port, " as rank ", rank, " of ", world_size);
  absl::Status status = StoreCall(absl::StrCat("joining the TCP store at ", host, ":", port,
                                               " as rank ", rank, " of ", world_size),
                                  timeout, [&] {
                                    c10d::TCPStoreOptions options;
                                    options.port = static_cast<uint16_t>(port);
                                    options.isServer = rank == 0;
                                    options.numWorkers = world_size;
                                    // Arrivals are awaited below, naming who is missing.
                                    options.waitWorkers = false;
                                    options.timeout = internal::ToChrono(timeout);
                                    impl->store =
                                        c10::make_intrusive<c10d::TCPStore>(host, options);
                                  });
  if (!status.ok()) return status;
  LOCKSTEP_RETURN_IF_ERROR(
      AwaitArrivals(*impl->store, rank, world_size, local_world_size, timeout, where));
  std::shared_ptr<Rendezvous> rendezvous(
      new Rendezvous(std::move(impl), rank, world_size, local_rank, timeout));
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

absl::StatusOr<std::string> Rendezvous::Get(const std::string& key) {
  std::vector<uint8_t> bytes;
  absl::Status status = Guarded(false, [&] {
    return StoreCall(
        absl::StrCat("waiting ", absl::FormatDuration(timeout_), " for rendezvous key ", key),
        timeout_, [&] {
          impl_->store->wait({key}, internal::ToChrono(timeout_));
          bytes = impl_->store->get(key);
        });
  });
  if (!status.ok()) return status;
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace collectives
}  // namespace lockstep
