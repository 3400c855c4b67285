#include "collectives/internal/communicator_base.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "base/status_macros.h"

namespace lockstep {
namespace collectives {
namespace internal {

GroupIdentity GroupIdentity::World(const WorldState& world, int rank) {
  GroupIdentity identity;
  for (int r = 0; r < world.world_size; ++r) identity.global_ranks.push_back(r);
  identity.rank = rank;
  identity.name = absl::StrCat(world.backend, " world ", FormatRanks(identity.global_ranks));
  identity.store_key = absl::StrCat("lockstep/", world.backend, "/world");
  return identity;
}

GroupIdentity GroupIdentity::Of(const GroupRegistry::Entry& entry) {
  GroupIdentity identity;
  identity.global_ranks = entry.global_ranks;
  identity.rank = entry.member;
  identity.name = entry.name;
  identity.store_key = entry.store_key;
  return identity;
}

absl::Status ValidateTimeout(absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout ", absl::FormatDuration(timeout), " must be positive"));
  }
  return absl::OkStatus();
}

absl::StatusOr<NewWorld> StartWorld(absl::string_view backend,
                                    const std::shared_ptr<Rendezvous>& rendezvous,
                                    absl::Duration timeout) {
  if (rendezvous == nullptr) return absl::InvalidArgumentError("rendezvous is null");
  LOCKSTEP_RETURN_IF_ERROR(ValidateTimeout(timeout));
  NewWorld world;
  rendezvous->StartHeartbeat();  // Note [Roll call]
  world.state = std::make_shared<WorldState>(std::string(backend), rendezvous->world_size(),
                                             timeout, rendezvous);
  world.identity = GroupIdentity::World(*world.state, rendezvous->rank());
  return world;
}

std::string CommunicatorBase::What(absl::string_view op) const {
  return absl::StrCat(op, " on ", identity_.name);
}

absl::StatusOr<std::unique_ptr<Communicator>> CommunicatorBase::NewGroup(
    absl::Span<const int> global_ranks) {
  const std::string what =
      absl::StrCat("creating a group of ", FormatRanks(global_ranks), " from ", identity_.name);
  if (failed()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the communicator is unusable after an earlier error (",
                     first_error_.message(), ")"));
  }
  absl::StatusOr<GroupRegistry::Entry> entry = world_->groups.Register(
      world_->backend, global_ranks, world_->world_size, identity_.global_ranks[identity_.rank]);
  if (!entry.ok()) return Annotate(entry.status(), what);
  LOCKSTEP_VLOG(2) << identity_.name << ": creating " << entry->name << " as its rank "
                   << entry->member << " (store key " << entry->store_key << ")";
  absl::StatusOr<std::unique_ptr<Communicator>> group = CreateGroup(GroupIdentity::Of(*entry));
  if (!group.ok()) return Annotate(group.status(), "members must create a group together");
  return group;
}

absl::Status CommunicatorBase::Collective(absl::string_view op,
                                          const std::function<absl::Status()>& body) {
  if (failed()) {
    return absl::FailedPreconditionError(
        absl::StrCat(What(op), ": the communicator is unusable after an earlier error (",
                     first_error_.message(), "); create a new one"));
  }
  if (world_->rendezvous != nullptr) {
    // Note [Rank claims] (rendezvous.cc): a rank claimed twice after the rendezvous completed.
    if (absl::Status twice = world_->rendezvous->ClaimedTwice(); !twice.ok()) {
      first_error_ = absl::FailedPreconditionError(absl::StrCat(What(op), ": ", twice.message()));
      return first_error_;
    }
  }
  ++collectives_;
  const absl::Time start = absl::Now();
  absl::Status status = body();
  if (status.ok()) return status;
  if (world_->rendezvous != nullptr) {
    // A peer that had seen the claim refused this collective while this process waited in it:
    // the claim is what went wrong, not the peer.
    if (absl::Status twice = world_->rendezvous->ClaimedTwice(); !twice.ok()) {
      first_error_ = absl::FailedPreconditionError(absl::StrCat(
          What(op), ": ", twice.message(), " (the collective itself: ", status.message(), ")"));
      return first_error_;
    }
  }
  const absl::Duration elapsed = absl::Now() - start;
  if (status.code() == absl::StatusCode::kUnavailable && elapsed >= world_->timeout) {
    status = absl::DeadlineExceededError(
        absl::StrCat(status.message(), " (no answer within the communicator's timeout of ",
                     absl::FormatDuration(world_->timeout), ": a peer did not arrive)"));
  }
  if (status.code() == absl::StatusCode::kUnavailable ||
      status.code() == absl::StatusCode::kDeadlineExceeded) {
    status = RollCall(*world_, identity_, absl::StrCat(collectives_ - 1), std::move(status));
  }
  LOCKSTEP_VLOG(1) << What(op) << " failed; the communicator is now unusable: " << status;
  first_error_ = status;
  return status;
}

absl::Status RollCall(const WorldState& world, const GroupIdentity& identity,
                      absl::string_view round, absl::Status status) {
  Rendezvous* store = world.rendezvous.get();
  if (store == nullptr || identity.global_ranks.size() < 2) return status;
  const std::string prefix = absl::StrCat(identity.store_key, "/roll-call/", round, "/");
  const int me = identity.global_ranks[identity.rank];
  const std::string unreachable =
      "the rendezvous store is unreachable for the roll call (global rank 0 serves it and may be "
      "the one gone)";
  if (absl::Status s = store->Set(absl::StrCat(prefix, me), "1"); !s.ok()) {
    return Annotate(status, unreachable);
  }
  std::map<int, int64_t> beats_before;
  for (int r : identity.global_ranks) {
    if (r == me) continue;
    absl::StatusOr<int64_t> beats = store->Heartbeat(r);
    if (!beats.ok()) return Annotate(status, unreachable);
    beats_before[r] = *beats;
  }
  // Wait for the others' answers, long enough to see a live process's heartbeat advance.
  const absl::Time now = absl::Now();
  const absl::Time deadline = now + std::max(std::min(absl::Seconds(2), world.timeout / 2),
                                             5 * Rendezvous::kHeartbeatPeriod);
  std::vector<int> silent;
  for (;;) {
    silent.clear();
    for (const auto& [r, _] : beats_before) {
      absl::StatusOr<bool> answered = store->Check(absl::StrCat(prefix, r));
      if (!answered.ok()) return Annotate(status, unreachable);
      if (!*answered) silent.push_back(r);
    }
    if (silent.empty() || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (silent.empty()) {
    return Annotate(status, "every member answered the roll call (the failure is shared)");
  }
  std::vector<int> gone, late;
  for (int r : silent) {
    absl::StatusOr<int64_t> beats = store->Heartbeat(r);
    if (!beats.ok()) return Annotate(status, unreachable);
    (*beats > beats_before[r] ? late : gone).push_back(r);
  }
  std::string verdict;
  if (!gone.empty()) {
    absl::StrAppend(&verdict, "global rank(s) ", FormatRanks(gone),
                    " gone (no answer to the roll call and no heartbeat: dead or stopped)");
  }
  if (!late.empty()) {
    absl::StrAppend(&verdict, verdict.empty() ? "" : "; ", "global rank(s) ", FormatRanks(late),
                    " alive but not answering (still inside the collective: late)");
  }
  return Annotate(status, verdict);
}

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep
