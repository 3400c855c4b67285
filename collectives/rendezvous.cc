#include "collectives/rendezvous.h"

#include <cstdlib>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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

Rendezvous::~Rendezvous() = default;

absl::StatusOr<std::shared_ptr<Rendezvous>> Rendezvous::File(const std::string& path, int rank,
                                                             int world_size,
                                                             absl::Duration timeout) {
  absl::Status valid;
  CheckRanks(rank, world_size, &valid);
  if (!valid.ok()) return valid;
  auto impl = std::make_unique<Impl>();
  absl::Status status = StoreCall(absl::StrCat("opening the file store ", path), timeout, [&] {
    impl->store = c10::make_intrusive<c10d::FileStore>(path, world_size);
    impl->store->setTimeout(internal::ToChrono(timeout));
  });
  if (!status.ok()) return status;
  return std::shared_ptr<Rendezvous>(
      new Rendezvous(std::move(impl), rank, world_size, /*local_rank=*/0, timeout));
}

absl::StatusOr<std::shared_ptr<Rendezvous>> Rendezvous::Tcp(const std::string& host, int port,
                                                            int rank, int world_size,
                                                            absl::Duration timeout,
                                                            int local_rank) {
  absl::Status valid;
  CheckRanks(rank, world_size, &valid);
  if (!valid.ok()) return valid;
  if (port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port ", port, " is outside [1, 65535]"));
  }
  auto impl = std::make_unique<Impl>();
  absl::Status status = StoreCall(absl::StrCat("joining the TCP store at ", host, ":", port,
                                               " as rank ", rank, " of ", world_size),
                                  timeout, [&] {
                                    c10d::TCPStoreOptions options;
                                    options.port = static_cast<uint16_t>(port);
                                    options.isServer = rank == 0;
                                    options.numWorkers = world_size;
                                    options.waitWorkers = true;
                                    options.timeout = internal::ToChrono(timeout);
                                    impl->store =
                                        c10::make_intrusive<c10d::TCPStore>(host, options);
                                  });
  if (!status.ok()) return status;
  return std::shared_ptr<Rendezvous>(
      new Rendezvous(std::move(impl), rank, world_size, local_rank, timeout));
}

absl::StatusOr<std::shared_ptr<Rendezvous>> Rendezvous::FromEnvironment(absl::Duration timeout) {
  absl::StatusOr<LaunchEnvironment> env = LaunchEnvironmentFromProcess();
  if (!env.ok()) return env.status();
  return Tcp(env->master_addr, env->master_port, env->rank, env->world_size, timeout,
             env->local_rank);
}

absl::Status Rendezvous::Set(const std::string& key, absl::string_view value) {
  return StoreCall(absl::StrCat("setting rendezvous key ", key), timeout_, [&] {
    impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  });
}

absl::StatusOr<std::string> Rendezvous::Get(const std::string& key) {
  std::vector<uint8_t> bytes;
  absl::Status status = StoreCall(
      absl::StrCat("waiting ", absl::FormatDuration(timeout_), " for rendezvous key ", key),
      timeout_, [&] {
        impl_->store->wait({key}, internal::ToChrono(timeout_));
        bytes = impl_->store->get(key);
      });
  if (!status.ok()) return status;
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace collectives
}  // namespace lockstep
