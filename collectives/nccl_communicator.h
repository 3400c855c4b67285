// collectives/nccl_communicator.h  (built only under --config=cuda)
//
// NcclCommunicator implements Communicator with the NCCL API directly, one NCCL communicator
// per group, on this process's CUDA device (LOCAL_RANK by default). CUDA tensors of that device
// move without copies; CPU tensors (such as BroadcastBytes's buffers and RNG states) are staged
// through a reused pinned host buffer and device buffer, with the upload, the collective and the
// download queued on one stream and waited for once (a broadcast's receivers skip the upload).
//
// Why the NCCL API rather than c10d's ProcessGroupNCCL: lockstep's collectives are small and
// latency-bound (RNG states, plan digests); the direct calls skip c10d's work objects and
// watchdog thread, and let us bound every wait ourselves (see the closing figures of the
// collectives issue for the measured comparison).
//
// Never a hang: communicators are created non-blocking, and every operation is polled
// (ncclCommGetAsyncError, cudaStreamQuery) until it completes, fails, or the timeout passes;
// then the communicator is aborted and the call returns kDeadlineExceeded (peer late),
// kUnavailable (NCCL reports a remote error) or kInternal. Calls return after the operation has
// completed on the device, so results are ready for the host.
//
// Sub-groups: NewGroup runs a fresh ncclCommInitRank among the members only; the first member
// publishes the NCCL unique id through the rendezvous store.
//
// Thread-safety: as Communicator.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(auto rendezvous, Rendezvous::FromEnvironment(absl::Seconds(60)));
//   LOCKSTEP_ASSIGN_OR_RETURN(auto world, NcclCommunicator::Create(rendezvous, {}));
//   LOCKSTEP_RETURN_IF_ERROR(world->Broadcast(cuda_state, /*root=*/0));

#ifndef LOCKSTEP_COLLECTIVES_NCCL_COMMUNICATOR_H_
#define LOCKSTEP_COLLECTIVES_NCCL_COMMUNICATOR_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/rendezvous.h"

namespace lockstep {
namespace collectives {

class NcclCommunicator : public Communicator {
 public:
  struct Options {
    // How long creation and each collective wait for peers. Default: 60 s.
    absl::Duration timeout = absl::Seconds(60);
    // CUDA device index; -1 selects the rendezvous's local rank. Default: -1.
    int device = -1;
  };

  // The world communicator of the rendezvous's processes. Collective over every process.
  // kInvalidArgument when the device does not exist (naming the index and the device count).
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      std::shared_ptr<Rendezvous> rendezvous, Options options);

  ~NcclCommunicator() override;

  int device() const;
  int rank() const override;
  int size() const override;
  const std::vector<int>& global_ranks() const override;
  absl::Duration timeout() const override;
  std::string DebugName() const override;

  absl::Status Broadcast(at::Tensor& tensor, int root) override;
  absl::StatusOr<std::vector<at::Tensor>> AllGather(const at::Tensor& input) override;
  absl::Status AllReduceSum(at::Tensor& tensor) override;
  absl::Status Barrier() override;
  absl::StatusOr<std::unique_ptr<Communicator>> NewGroup(
      absl::Span<const int> global_ranks) override;

 private:
  struct Shared;
  struct Group;
  // Enqueues one in-place NCCL operation on (device buffer, element count, type).
  using InPlaceLaunch =
      std::function<ncclResult_t(void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)>;

  NcclCommunicator(std::shared_ptr<Shared> shared, std::unique_ptr<Group> group);
  // Runs `launch` on `tensor` (staged through the device when on the CPU) and waits for it.
  // `upload`: whether a CPU tensor's current contents are needed on the device (not for the
  // receivers of a broadcast).
  absl::Status InPlace(const std::string& what, at::Tensor& tensor, const InPlaceLaunch& launch,
                       bool upload = true);
  absl::Status StagedInPlace(const std::string& what, at::Tensor& tensor,
                             const InPlaceLaunch& launch, ncclDataType_t type, bool upload);

  std::shared_ptr<Shared> shared_;
  std::unique_ptr<Group> group_;
};

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_NCCL_COMMUNICATOR_H_
