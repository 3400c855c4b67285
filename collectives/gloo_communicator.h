// collectives/gloo_communicator.h
//
// GlooCommunicator implements Communicator over c10d's ProcessGroupGloo: CPU tensors always,
// and CUDA tensors where the LibTorch build has Gloo's CUDA support (the CUDA builds do). One
// Gloo context per group; sub-groups get their own context under a key of the rendezvous store
// derived from their rank list, so groups created in the same order by their members meet.
//
// Errors: every Gloo operation runs with the communicator's timeout; a peer that died surfaces
// as kUnavailable (its connection closed), a peer that does not arrive as kDeadlineExceeded.
// Either way the message names the operation and the group, and the communicator is unusable
// afterwards (see communicator.h).
//
// Out-of-step calls: Gloo itself checks a message's size on its transport thread and aborts the
// whole process when it differs, so members that call different collectives (another kind, root,
// dtype or size, or one member a collective behind) would take the job down. Every collective
// therefore starts with one fixed-size exchange of what each member is calling (kind, root,
// dtype, bytes and the collective's sequence number on this communicator); when the members
// differ, every member gets the same kFailedPrecondition naming each member's call, and no
// payload moves.
//
// Signals: Gloo writes to its sockets without suppressing SIGPIPE, whose default action would
// kill a survivor writing to a peer that just died. Create therefore sets SIGPIPE to ignored,
// process-wide, when it is at its default disposition (as gRPC does); a handler the program
// installed, or an existing ignore, is left as it is.
//
// Thread-safety: as Communicator (one thread per communicator at a time).
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(auto rendezvous, Rendezvous::FromEnvironment(absl::Seconds(60)));
//   LOCKSTEP_ASSIGN_OR_RETURN(auto world,
//                             GlooCommunicator::Create(rendezvous, GlooCommunicator::Options()));
//   LOCKSTEP_RETURN_IF_ERROR(world->AllReduceSum(gradient_norms));

#ifndef LOCKSTEP_COLLECTIVES_GLOO_COMMUNICATOR_H_
#define LOCKSTEP_COLLECTIVES_GLOO_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "c10/util/intrusive_ptr.h"
#include "collectives/communicator.h"
#include "collectives/internal/communicator_base.h"
#include "collectives/rendezvous.h"

namespace c10d {
class ProcessGroupGloo;
class Store;
}  // namespace c10d

namespace lockstep {
namespace collectives {

class GlooCommunicator : public internal::CommunicatorBase {
 public:
  struct Options {
    // How long a collective (and group creation) waits for peers. Default: 60 s.
    absl::Duration timeout = absl::Seconds(60);
    // Address for Gloo's transport to bind. Default: empty, meaning this host's name, falling
    // back to the loopback address when the name does not resolve.
    std::string hostname;
    // Gloo's own timeout inside each operation, when it should differ from `timeout` (zero: the
    // same). Tests set it longer to prove that `timeout` bounds every collective by itself.
    absl::Duration engine_timeout = absl::ZeroDuration();
  };

  // The world communicator of the rendezvous's processes. Collective over every process.
  // kInvalidArgument for a null rendezvous or a non-positive timeout.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(
      std::shared_ptr<Rendezvous> rendezvous, Options options);

  // A communicator over a Gloo process group the program already made (torch.distributed's
  // group, from Python): `global_ranks` are its members' global ranks in group-rank order, of a
  // world of `world_size` processes. Collectives run on that group (with the in-step check);
  // NewGroup is refused with kFailedPrecondition (make the sub-group with the program's own
  // library and adopt it). kInvalidArgument when the rank list does not match the group's size,
  // repeats a rank or leaves [0, world_size), or for a null group or a non-positive timeout.
  // Not collective: adopting a group exchanges nothing.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Adopt(
      c10::intrusive_ptr<c10d::ProcessGroupGloo> process_group, std::vector<int> global_ranks,
      int world_size, absl::Duration timeout);

  // Adopt, plus the host lane (Note [Host lane] in nccl_communicator.cc): when every member is
  // on this host, CPU tensors of at most HostLane::kMaxBytes per member move through shared
  // memory instead of Gloo's sockets, the rest through Gloo as above. Collective over the group:
  // the members meet in `store` (one every member shares, such as torch.distributed's default
  // store; keys under "lockstep/") under `lane_key`, which must be the same on every member and
  // new to the store (name the group and count its adoptions). A member that does not arrive
  // within `timeout` makes it kDeadlineExceeded. A null `store` is Adopt without a lane.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Adopt(
      c10::intrusive_ptr<c10d::ProcessGroupGloo> process_group, std::vector<int> global_ranks,
      int world_size, absl::Duration timeout, c10::intrusive_ptr<c10d::Store> store,
      const std::string& lane_key);

  // Whether CPU tensors this small take the host lane (an adopted group with a lane).
  bool has_host_lane() const;

  ~GlooCommunicator() override;

  absl::Status Broadcast(at::Tensor& tensor, int root) override;
  absl::StatusOr<std::vector<at::Tensor>> AllGather(const at::Tensor& input) override;
  absl::Status AllReduceSum(at::Tensor& tensor) override;
  absl::Status Barrier() override;

 private:
  struct Transport;  // the rendezvous and Gloo device, shared with every group
  struct Group;      // this group's process group
  GlooCommunicator(std::shared_ptr<internal::WorldState> world, internal::GroupIdentity identity,
                   std::shared_ptr<Transport> transport, std::unique_ptr<Group> group);
  absl::StatusOr<std::unique_ptr<Communicator>> CreateGroup(
      internal::GroupIdentity identity) override;

  // What a member is calling, as the in-step check compares it (see the top of this file).
  struct Call {
    int64_t kind = 0;
    int64_t root = -1;
    int64_t dtype = -1;
    int64_t bytes = 0;
  };
  // OK when every member is making `call` as this one's next collective; kFailedPrecondition
  // naming each member's call otherwise. Runs inside the collective's body.
  absl::Status CheckInStep(const Call& call, const std::string& what);

  std::shared_ptr<Transport> transport_;  // null for an adopted group
  std::unique_ptr<Group> group_;
  int64_t calls_ = 0;  // collectives started on this communicator
};

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_GLOO_COMMUNICATOR_H_
