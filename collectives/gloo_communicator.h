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
// A torch.distributed group the program made (Gloo's or NCCL's) is adopted with
// AdoptedCommunicator (adopted_communicator.h), which runs the same checks.
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
#include "collectives/communicator.h"
#include "collectives/internal/communicator_base.h"
#include "collectives/rendezvous.h"

namespace lockstep {
namespace collectives {
namespace internal {
struct GlooTransport;  // the Gloo device, shared with every group (Note [Transport and group])
struct GlooGroup;      // one group's process group
}  // namespace internal

// A Communicator over c10d's ProcessGroupGloo (see the top of this file).
class GlooCommunicator final
    : public internal::TransportCommunicator<GlooCommunicator, internal::GlooTransport,
                                             internal::GlooGroup> {
 public:
  // The world communicator's settings, which the groups made from it share.
  struct Options {
    // How long a collective (and group creation) waits for peers. Default: 60 s.
    absl::Duration timeout = absl::Seconds(60);
    // Address for Gloo's transport to bind. Default: empty, meaning the interface named by
    // GLOO_SOCKET_IFNAME, else (a TCP rendezvous whose store is not on the loopback address) the
    // local address of the route to the store, else this host's name, falling back to the
    // loopback address when the name does not resolve (Note [Gloo's address]).
    std::string hostname;
    // Gloo's own timeout inside each operation, when it should differ from `timeout` (zero: the
    // same). Tests set it longer to prove that `timeout` bounds every collective by itself.
    absl::Duration engine_timeout = absl::ZeroDuration();
  };

  // The world communicator of the rendezvous's processes. Collective over every process.
  // kInvalidArgument for a null rendezvous or a non-positive timeout.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(
      std::shared_ptr<Rendezvous> rendezvous, Options options);

  ~GlooCommunicator() override;

  // Communicator::Broadcast over Gloo (see communicator.h).
  absl::Status Broadcast(at::Tensor& tensor, int root) override;
  // Communicator::AllGather over Gloo (see communicator.h).
  absl::StatusOr<std::vector<at::Tensor>> AllGather(const at::Tensor& input) override;
  // Communicator::AllReduceSum over Gloo (see communicator.h).
  absl::Status AllReduceSum(at::Tensor& tensor) override;
  // Communicator::Barrier over Gloo (see communicator.h).
  absl::Status Barrier() override;

 private:
  friend TransportCommunicator;  // constructs the world and every group
  GlooCommunicator(std::shared_ptr<internal::WorldState> world, internal::GroupIdentity identity,
                   std::shared_ptr<internal::GlooTransport> transport,
                   std::unique_ptr<internal::GlooGroup> group);
};

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_GLOO_COMMUNICATOR_H_
