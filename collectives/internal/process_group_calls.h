// collectives/internal/process_group_calls.h
//
// Private to collectives/: the collectives of one c10d process group as lockstep runs them,
// shared by GlooCommunicator (the Gloo groups it makes) and AdoptedCommunicator (groups the
// program made: torch.distributed's Gloo or NCCL groups). For every call:
//   - the in-step exchange first (gloo_communicator.h, "Out-of-step calls"): one fixed-size
//     all-gather of what each member is calling; members that differ get the same
//     kFailedPrecondition naming each member's call, and no payload moves (Gloo would abort the
//     process on a size mismatch);
//   - the wait is bounded by the communicator's timeout (a peer that does not arrive is
//     kDeadlineExceeded naming the operation);
//   - bfloat16 moves as bytes where only bytes move (Gloo refuses the dtype);
//   - with a staging device (an NCCL group: its collectives take tensors on its device only),
//     CPU tensors are copied to that device and back.
// Contiguity and the root's range are checked before anything moves.
//
// Thread-safety: one thread at a time (the communicator's).

#ifndef LOCKSTEP_COLLECTIVES_INTERNAL_PROCESS_GROUP_CALLS_H_
#define LOCKSTEP_COLLECTIVES_INTERNAL_PROCESS_GROUP_CALLS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "c10/util/intrusive_ptr.h"
#include "collectives/c10d_group.h"

namespace lockstep {
namespace collectives {
namespace internal {

class ProcessGroupCalls {
 public:
  // `global_ranks` name the members in errors; `staging` is the device CPU tensors are copied to
  // (nullopt: the group takes CPU tensors itself).
  ProcessGroupCalls(c10::intrusive_ptr<C10dGroup> group, std::vector<int> global_ranks,
                    std::optional<at::Device> staging, absl::Duration timeout);

  // The collectives; `what` names the operation in errors (CommunicatorBase::What).
  absl::Status Broadcast(at::Tensor& tensor, int root, const std::string& what);
  absl::StatusOr<std::vector<at::Tensor>> AllGather(const at::Tensor& input,
                                                    const std::string& what);
  absl::Status AllReduceSum(at::Tensor& tensor, const std::string& what);
  absl::Status Barrier(const std::string& what);

  int size() const { return static_cast<int>(global_ranks_.size()); }

  // The collectives, as the in-step exchange names them.
  enum CallKind : int64_t { kBroadcast = 1, kAllGather = 2, kAllReduce = 3, kBarrier = 4 };

 private:
  friend class ProcessGroupCallsTestPeer;  // a peer that checks in and then stalls

  // What a member is calling, as the in-step exchange compares it.
  struct Call {
    int64_t kind = 0;
    int64_t root = -1;
    int64_t dtype = -1;
    int64_t bytes = 0;
  };
  absl::Status CheckInStep(const Call& call, const std::string& what);
  // `tensor` where the group's collectives take it (itself, or a copy on the staging device).
  absl::StatusOr<at::Tensor> Staged(const at::Tensor& tensor, const std::string& what) const;

  c10::intrusive_ptr<C10dGroup> group_;
  std::vector<int> global_ranks_;
  std::optional<at::Device> staging_;
  absl::Duration timeout_;
  int64_t calls_ = 0;  // collectives started on this group
};

// Ignores SIGPIPE when it is at its default disposition (gloo_communicator.h, "Signals").
absl::Status IgnoreSigpipeAtDefault();

// Checks `tensor` is defined and contiguous (kInvalidArgument naming `what` otherwise).
absl::Status CheckContiguous(const at::Tensor& tensor, const std::string& what);

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_INTERNAL_PROCESS_GROUP_CALLS_H_
