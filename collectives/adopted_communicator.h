// collectives/adopted_communicator.h
//
// AdoptedCommunicator: a lockstep Communicator over a c10d process group the program already
// made — torch.distributed's, from Python (python/lockstep/distributed.py adopts each group on
// its first use). Gloo groups take CPU and CUDA tensors; NCCL groups (LibTorch >= 2.0 with CUDA)
// take tensors on their device, so CPU tensors are copied to Options::staging_device and back.
// Every collective keeps the checks of lockstep's own communicators (gloo_communicator.h): the
// in-step exchange (members calling different collectives get kFailedPrecondition naming each
// member's call, never a crash or a hang), the communicator's timeout, and after any error the
// communicator is unusable (communicator.h).
//
// Host lane: with Options::store (a store every member shares: torch.distributed's default
// store), Adopt is collective over the group, and when every member is on this host the members
// connect a shared-memory host lane (Note [Host lane] in nccl_communicator.cc). CPU tensors of at
// most HostLane::kMaxBytes per member then move through it, checked by the lane itself (kind,
// root and size), the rest through the group. The choice depends only on the group and the
// tensor's device and size, which the members share.
//
// NewGroup is refused with kFailedPrecondition: make the sub-group with the program's own
// library (torch.distributed.new_group) and adopt it.
//
// NCCL groups: a collective waits as torch's NCCL backend does (a peer that never arrives is
// caught by its watchdog, or by the timeout where TORCH_NCCL_BLOCKING_WAIT=1); the host lane and
// the in-step exchange behave as for Gloo.
//
// Thread-safety: as Communicator (one thread per communicator at a time).
//
// Example (the binding's):
//   AdoptedCommunicator::Options options;
//   options.global_ranks = {0, 1};
//   options.world_size = 4;
//   options.store = default_store;
//   options.lane_key = "adopted/3/0";
//   LOCKSTEP_ASSIGN_OR_RETURN(auto comm, AdoptedCommunicator::Adopt(gloo_group, options));

#ifndef LOCKSTEP_COLLECTIVES_ADOPTED_COMMUNICATOR_H_
#define LOCKSTEP_COLLECTIVES_ADOPTED_COMMUNICATOR_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "c10/core/Device.h"
#include "c10/util/intrusive_ptr.h"
#include "collectives/c10d_group.h"
#include "collectives/communicator.h"
#include "collectives/internal/communicator_base.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace lockstep {
namespace collectives {

// A Communicator over a c10d process group the program already made (see the top of this file).
class AdoptedCommunicator : public internal::CommunicatorBase {
 public:
  // What Adopt needs to know of the group, which c10d's group does not say.
  struct Options {
    // The members' global ranks in group-rank order, of a world of `world_size` processes.
    std::vector<int> global_ranks;
    // Number of processes in the program's world (> every global rank). Default: 0, refused.
    int world_size = 0;
    // How long a collective (and the host lane's setup) waits for peers. Default: 60 s.
    absl::Duration timeout = absl::Seconds(60);
    // The store the members meet in to connect the host lane (null: no lane), and the lane's
    // key in it (under "lockstep/"), the same on every member and new to the store: name the
    // group and count its adoptions.
    c10::intrusive_ptr<c10d::Store> store;
    // The host lane's key in `store` (required with a store; see above).
    std::string lane_key;
    // Where the group's collectives take their tensors when its backend takes no CPU tensors
    // (NCCL: the rank's CUDA device). Unset: the group takes CPU tensors (Gloo).
    std::optional<c10::Device> staging_device;
    // Names the backend in the communicator's name ("adopted nccl group [0, 1]").
    std::string backend = "gloo";
  };

  // kInvalidArgument for a null group, a rank list that does not match the group's size,
  // repeats a rank or leaves [0, world_size), a non-positive timeout, a store without a lane key
  // or a staging device that is not CUDA; with a store, the rendezvous errors of the lane's setup
  // (kDeadlineExceeded naming the key when a member does not come).
  static absl::StatusOr<std::unique_ptr<AdoptedCommunicator>> Adopt(
      c10::intrusive_ptr<C10dGroup> group, Options options);

  ~AdoptedCommunicator() override;

  // Whether CPU tensors of at most HostLane::kMaxBytes take the host lane.
  bool has_host_lane() const;

  // Communicator::Broadcast over the adopted group (see communicator.h).
  absl::Status Broadcast(at::Tensor& tensor, int root) override;
  // Communicator::AllGather over the adopted group (see communicator.h).
  absl::StatusOr<std::vector<at::Tensor>> AllGather(const at::Tensor& input) override;
  // Communicator::AllReduceSum over the adopted group (see communicator.h).
  absl::Status AllReduceSum(at::Tensor& tensor) override;
  // Communicator::Barrier over the adopted group (see communicator.h).
  absl::Status Barrier() override;

 private:
  struct Group;  // the group's calls and its host lane
  AdoptedCommunicator(std::shared_ptr<internal::WorldState> world, internal::GroupIdentity identity,
                      std::unique_ptr<Group> group);
  absl::StatusOr<std::unique_ptr<Communicator>> CreateGroup(
      internal::GroupIdentity identity) override;

  std::unique_ptr<Group> group_;
};

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_ADOPTED_COMMUNICATOR_H_
