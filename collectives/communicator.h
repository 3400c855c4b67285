// collectives/communicator.h
//
// Communicator is lockstep's narrow view of a communication group: the handful of collectives
// that keeping replicas in step needs (broadcast, all-gather, all-reduce, barrier, bytes and
// object broadcast) plus the mapping from a member's group rank to its global rank. Modules
// depend on this interface only; the in-process fake (testing/fake_communicator.h), c10d's Gloo
// (gloo_communicator.h) and NCCL (nccl_communicator.h, --config=cuda) implement it.
//
// Contract shared by every implementation:
// - Every member calls the same collectives in the same order with matching arguments
//   (same root, dtype and shape). A call never hangs: a peer that died, or that does not arrive
//   within the communicator's timeout, makes the call return an error naming the operation and
//   the group. Status codes tell the caller what to do next:
//     kDeadlineExceeded   a peer did not arrive in time;
//     kUnavailable        a peer is gone (connection closed, rank failed);
//     kFailedPrecondition members called different collectives or disagree on arguments;
//     kInvalidArgument    this member's own arguments are wrong (bad root, bad rank list).
//   After an error the communicator is not usable for further collectives.
// - "root" arguments and rank() are ranks within this communicator (0..size()-1), never global
//   ranks; GlobalRank() translates.
// - Sub-groups: NewGroup is called by exactly the members of the new group, with the same list.
//
// Thread-safety: one thread calls a given communicator at a time. Distinct communicators may
// be used from distinct threads.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(auto cp_group, world.NewGroup(topology.CpGroup(world.rank())));
//   LOCKSTEP_RETURN_IF_ERROR(cp_group->Broadcast(seed_tensor, /*root=*/0));

#ifndef LOCKSTEP_COLLECTIVES_COMMUNICATOR_H_
#define LOCKSTEP_COLLECTIVES_COMMUNICATOR_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace lockstep {
namespace collectives {

// lockstep's narrow view of a communication group (see the top of this file for the contract
// every implementation keeps).
class Communicator {
 public:
  virtual ~Communicator() = default;

  // This member's rank within the communicator, in [0, size()).
  virtual int rank() const = 0;
  // Number of members.
  virtual int size() const = 0;
  // Global ranks of the members, indexed by group rank.
  virtual const std::vector<int>& global_ranks() const = 0;
  // How long a collective waits for its peers before failing with kDeadlineExceeded.
  virtual absl::Duration timeout() const = 0;
  // Short human-readable name of the group ("gloo world [0, 1, 2, 3]"), used in errors.
  virtual std::string DebugName() const = 0;

  // Global rank of member `group_rank`; kInvalidArgument when out of range.
  absl::StatusOr<int> GlobalRank(int group_rank) const;

  // Copies root's `tensor` into every member's `tensor`, in place.
  // Precondition: every member's tensor has the same dtype and shape, and is contiguous.
  virtual absl::Status Broadcast(at::Tensor& tensor, int root) = 0;

  // Returns every member's `input`, indexed by group rank.
  // Precondition: every member's input has the same dtype and shape.
  virtual absl::StatusOr<std::vector<at::Tensor>> AllGather(const at::Tensor& input) = 0;

  // AllGather, calling `then` on the gathered tensors as soon as they are defined: where the
  // collective is ordered on a device stream (NCCL, CUDA tensors), that is before this member
  // waits for it, so device work `then` queues on the current stream runs right after the gather
  // with no round trip through the host; elsewhere (Gloo, the fake, CPU tensors) after the
  // collective completed. `then` must only queue work or read metadata: on a stream the tensors'
  // contents are not there yet. The collective's error wins over `then`'s (whose queued work is
  // then meaningless); `then`'s error is returned once the collective completed. On a stream the
  // wait covers what `then` queued, so that work counts against timeout() too.
  virtual absl::StatusOr<std::vector<at::Tensor>> AllGatherThen(
      const at::Tensor& input,
      const std::function<absl::Status(const std::vector<at::Tensor>&)>& then);

  // Replaces every member's `tensor` with the element-wise sum over members, in place.
  virtual absl::Status AllReduceSum(at::Tensor& tensor) = 0;

  // Returns once every member has called Barrier.
  virtual absl::Status Barrier() = 0;

  // A communicator over the members with the given global ranks, in that order. Called by all
  // of them (and only them) with the same list; this process must be in it. kInvalidArgument
  // for an empty list, duplicates, unknown ranks, or a list without this process.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> NewGroup(
      absl::Span<const int> global_ranks) = 0;
};

// Copies root's `bytes` into every member's `bytes`. Members other than the root need not know
// the length in advance.
absl::Status BroadcastBytes(Communicator& comm, std::string* bytes, int root);

// Broadcasts a message-like object (anything with SerializeAsString() and ParseFromString(),
// such as a protobuf message) from root to every member.
template <typename Message>
absl::Status BroadcastObject(Communicator& comm, Message* message, int root) {
  std::string bytes;
  if (comm.rank() == root) bytes = message->SerializeAsString();
  absl::Status status = BroadcastBytes(comm, &bytes, root);
  if (!status.ok()) return status;
  if (comm.rank() != root && !message->ParseFromString(bytes)) {
    return absl::DataLossError("broadcast object from root " + std::to_string(root) +
                               " does not parse (" + std::to_string(bytes.size()) + " bytes)");
  }
  return absl::OkStatus();
}

// Note [A group of one is no group]
// A group whose only member is the caller needs no collective: a broadcast, gather or reduce over
// it is the identity, and agreement holds trivially. Callers that run a dimension's collectives
// (the model's TP and CP collectives, gradient reduction over DP, replica agreement over TP x CP)
// hold such a group as nullptr and skip the collective, so a TP 1 or CP 1 job pays nothing for
// the dimension it does not use. WithOthers is the one place this is decided.

// `group` when it has members other than the caller; nullptr for nullptr or a group of one
// (Note [A group of one is no group]).
inline Communicator* WithOthers(Communicator* group) {
  return group != nullptr && group->size() > 1 ? group : nullptr;
}

// Checks a NewGroup rank list against a world of `world_size` and the caller's global rank:
// non-empty, no duplicates, every rank in [0, world_size), caller included. Returns the caller's
// index in the list.
absl::StatusOr<int> ValidateGroupRanks(absl::Span<const int> global_ranks, int world_size,
                                       int my_global_rank);

// "[0, 2, 4]"
std::string FormatRanks(absl::Span<const int> ranks);

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_COMMUNICATOR_H_
