// collectives/internal/communicator_base.h
//
// Private to collectives/: the skeleton every Communicator implementation (Gloo, NCCL, the
// in-process fake) shares, so that they agree on the contract of communicator.h by construction:
//   - group identity (global ranks, this member's rank, a name for errors) and its accessors;
//   - NewGroup: rank-list validation, numbering of groups created over the same ranks, and the
//     group's name and rendezvous key (GroupRegistry), then the backend's CreateGroup;
//   - every collective runs through Collective(), which refuses to run on a communicator that
//     failed earlier, and marks this one failed on any error: after an error a communicator is
//     unusable (kFailedPrecondition naming the first error), for every implementation;
//   - a communication failure (kUnavailable from the exception boundary, base/torch_boundary.h)
//     that arrives after the communicator's timeout has passed is reported as kDeadlineExceeded:
//     c10d and Gloo throw the same exception types for a peer that is gone and one that did not
//     arrive, so the communicator's own clock tells them apart;
//   - Note [Roll call]: transports name a socket address, not a rank. So after a kUnavailable or
//     kDeadlineExceeded, each member that saw the failure writes its global rank under the
//     collective's sequence number in the rendezvous store and waits up to min(2 s, timeout / 2)
//     (at least five heartbeat periods) for the others. A member that does not answer is named:
//     "gone" when its process's heartbeat (Rendezvous::StartHeartbeat, a counter a thread of
//     every process advances) stopped too — dead or stopped — and "late" when it is alive but
//     still inside the collective. Only on the failure path; the error comes at most that wait
//     after the failure was seen. Creating a communicator (its transport's connections, made
//     through the store) calls the same roll call on failure, under the round "create".
//
// Thread-safety: as Communicator (one thread per communicator; the registry is thread-safe).

#ifndef LOCKSTEP_COLLECTIVES_INTERNAL_COMMUNICATOR_BASE_H_
#define LOCKSTEP_COLLECTIVES_INTERNAL_COMMUNICATOR_BASE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/internal/group_registry.h"
#include "collectives/rendezvous.h"

namespace lockstep {
namespace collectives {
namespace internal {

// What a world communicator and every group made from it share.
struct WorldState {
  WorldState(std::string backend, int world_size, absl::Duration timeout,
             std::shared_ptr<Rendezvous> rendezvous = nullptr)
      : backend(std::move(backend)),
        world_size(world_size),
        timeout(timeout),
        rendezvous(std::move(rendezvous)) {}

  const std::string backend;  // "gloo", "nccl", "fake": names groups and store keys
  const int world_size;
  const absl::Duration timeout;
  // The store of the roll call that names the members a failed collective lost (null: none).
  const std::shared_ptr<Rendezvous> rendezvous;
  GroupRegistry groups;
};

// One group as its member sees it.
struct GroupIdentity {
  std::vector<int> global_ranks;
  int rank = 0;           // this member's rank in the group
  std::string name;       // "gloo world [0, 1]", "nccl group [0, 2] #1"
  std::string store_key;  // where its members meet in the rendezvous store

  // The identity of the whole world of `world` as seen by global rank `rank`.
  static GroupIdentity World(const WorldState& world, int rank);
  // The identity of a group the registry numbered.
  static GroupIdentity Of(const GroupRegistry::Entry& entry);
};

// Checks what every communicator's Create needs: a positive timeout.
absl::Status ValidateTimeout(absl::Duration timeout);

// The shared state and this process's identity of a new world communicator of `backend` over
// `rendezvous`'s processes. kInvalidArgument for a null rendezvous or a non-positive timeout.
struct NewWorld {
  std::shared_ptr<WorldState> state;
  GroupIdentity identity;
};
absl::StatusOr<NewWorld> StartWorld(absl::string_view backend,
                                    const std::shared_ptr<Rendezvous>& rendezvous,
                                    absl::Duration timeout);

// Note [Roll call]: `status` (a failure `identity`'s member saw in `round`, a key no other round
// of the group uses) annotated with the members that did not report the same failure. `status`
// unchanged for a world without a rendezvous or a group of one.
absl::Status RollCall(const WorldState& world, const GroupIdentity& identity,
                      absl::string_view round, absl::Status status);

class CommunicatorBase : public Communicator {
 public:
  int rank() const final { return identity_.rank; }
  int size() const final { return static_cast<int>(identity_.global_ranks.size()); }
  const std::vector<int>& global_ranks() const final { return identity_.global_ranks; }
  absl::Duration timeout() const final { return world_->timeout; }
  std::string DebugName() const final { return identity_.name; }

  absl::StatusOr<std::unique_ptr<Communicator>> NewGroup(absl::Span<const int> global_ranks) final;

  // Whether an earlier error made this communicator unusable.
  bool failed() const { return !first_error_.ok(); }

 protected:
  CommunicatorBase(std::shared_ptr<WorldState> world, GroupIdentity identity)
      : world_(std::move(world)), identity_(std::move(identity)) {}

  const std::shared_ptr<WorldState>& world_state() const { return world_; }
  const GroupIdentity& identity() const { return identity_; }

  // Creates this backend's communicator for a group registered by NewGroup (identity.rank is
  // the caller's member index). Collective over the group's members.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> CreateGroup(GroupIdentity identity) = 0;

  // "<op> on <name>", the context every error of a collective starts with.
  std::string What(absl::string_view op) const;

  // Runs one collective (see the top of this file). `body` returns the collective's status;
  // its LibTorch/c10d calls go through CallTorch with What(op) as context.
  absl::Status Collective(absl::string_view op, const std::function<absl::Status()>& body);

 private:
  std::shared_ptr<WorldState> world_;
  GroupIdentity identity_;
  absl::Status first_error_;
  int64_t collectives_ = 0;  // sequence number of the next collective
};

// Note [Transport and group]
// A backend's communicators are made of two parts. Its Transport is what the world communicator
// and every group made from it share (Gloo's device; NCCL's rendezvous, device and staging
// mode), held by shared ownership so that it outlives the last of them. Its Group is what one
// communicator alone owns (a Gloo process group; an NCCL communicator, its lanes and staging
// buffers), made for one group identity by
//   static absl::StatusOr<std::unique_ptr<Group>> Group::Create(
//       const Transport&, const WorldState&, const GroupIdentity&, absl::Duration timeout);
// TransportCommunicator makes the world communicator and every later group the same way, so a
// backend writes only its Transport, its Group and its collectives. `Derived` (the backend's
// communicator) has a constructor taking (world, identity, transport, group) that it forwards
// here, and befriends this class so that CreateWorld and CreateGroup can call it.
template <typename Derived, typename Transport, typename Group>
class TransportCommunicator : public CommunicatorBase {
 protected:
  TransportCommunicator(std::shared_ptr<WorldState> world, GroupIdentity identity,
                        std::shared_ptr<Transport> transport, std::unique_ptr<Group> group)
      : CommunicatorBase(std::move(world), std::move(identity)),
        transport_(std::move(transport)),
        group_(std::move(group)) {}

  // The world communicator of `world` over `transport`: its Group, then the communicator.
  static absl::StatusOr<std::unique_ptr<Derived>> CreateWorld(NewWorld world,
                                                              std::shared_ptr<Transport> transport,
                                                              absl::Duration timeout) {
    absl::StatusOr<std::unique_ptr<Group>> group =
        Group::Create(*transport, *world.state, world.identity, timeout);
    if (!group.ok()) return group.status();
    return std::unique_ptr<Derived>(new Derived(std::move(world.state), std::move(world.identity),
                                                std::move(transport), *std::move(group)));
  }

  const Transport& transport() const { return *transport_; }
  Group& group() const { return *group_; }

 private:
  absl::StatusOr<std::unique_ptr<Communicator>> CreateGroup(GroupIdentity identity) final {
    absl::StatusOr<std::unique_ptr<Group>> group =
        Group::Create(*transport_, *world_state(), identity, timeout());
    if (!group.ok()) return group.status();
    return std::unique_ptr<Communicator>(
        new Derived(world_state(), std::move(identity), transport_, *std::move(group)));
  }

  std::shared_ptr<Transport> transport_;  // shared with the world and every group made from it
  std::unique_ptr<Group> group_;          // this communicator's own
};

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_INTERNAL_COMMUNICATOR_BASE_H_
