// collectives/nccl_communicator.h  (built only under --config=cuda)
//
// NcclCommunicator implements Communicator with the NCCL API directly, one NCCL communicator
// per group, on this process's CUDA device (LOCAL_RANK by default). CUDA tensors of that device
// move without copies; CPU tensors (such as BroadcastBytes's buffers and RNG states) are staged
// through buffers each communicator owns and reuses: by default pinned host memory mapped into
// the device, which NCCL's kernels read and write directly (zero-copy: nothing but the
// collective is queued), or, as Options::cpu_staging chooses, a pinned host buffer and a device
// buffer with the upload, the collective and the download queued on one stream and waited for
// once (a broadcast's receivers skip the upload). All-gather stages its input and output the same
// way. When every member of a group runs on this host, small CPU tensors (at most 64 KiB per
// member) skip the devices altogether and move through a shared-memory segment, the host lane
// (Note [Host lane] in the .cc; Options::host_lane turns it off); an RNG hand-back is such a
// tensor.
//
// Why the NCCL API rather than c10d's ProcessGroupNCCL: lockstep's collectives are small and
// latency-bound (RNG states, plan digests); the direct calls skip c10d's work objects and
// watchdog thread, and let us bound every wait ourselves.
//
// Never a hang: communicators are created non-blocking. A collective call that returns
// ncclInProgress has not yet enqueued its kernel, so nothing else is queued on the stream until
// the communicator's state leaves ncclInProgress (Note [Non-blocking enqueue] in the .cc); then
// the stream is polled until the work completes, fails, or the timeout passes. On timeout or
// error the NCCL communicator is aborted and the call returns kDeadlineExceeded (peer late),
// kUnavailable (NCCL reports a remote or system error) or kInternal; the communicator is then
// unusable, as communicator.h says. Calls return after the operation has completed on the
// device, so results are ready for the host.
//
// Sub-groups: NewGroup runs a fresh ncclCommInitRank among the members only; the first member
// publishes the NCCL unique id through the rendezvous store.
//
// Thread-safety: as Communicator. Each communicator has its own staging buffers, so distinct
// communicators (a world and its groups) may run collectives from distinct threads.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(auto rendezvous, Rendezvous::FromEnvironment(absl::Seconds(60)));
//   LOCKSTEP_ASSIGN_OR_RETURN(auto world,
//                             NcclCommunicator::Create(rendezvous, NcclCommunicator::Options()));
//   LOCKSTEP_RETURN_IF_ERROR(world->Broadcast(cuda_state, /*root=*/0));

#ifndef LOCKSTEP_COLLECTIVES_NCCL_COMMUNICATOR_H_
#define LOCKSTEP_COLLECTIVES_NCCL_COMMUNICATOR_H_

#include <functional>
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
struct NcclTransport;  // the rendezvous and device, shared with every group (Note [Transport
                       // and group])
struct NcclGroup;      // one group's NCCL communicators and staging buffers
}  // namespace internal

// A Communicator over the NCCL API, on this process's CUDA device (see the top of this file).
class NcclCommunicator final
    : public internal::TransportCommunicator<NcclCommunicator, internal::NcclTransport,
                                             internal::NcclGroup> {
 public:
  // How CPU tensors reach NCCL (Note [CPU staging] in internal/nccl_staging.h).
  enum class CpuStaging {
    kMappedHost,    // NCCL reads and writes mapped pinned host memory directly (zero-copy)
    kDeviceCopies,  // pinned host and device buffers, with copies queued around the collective
  };

  // The world communicator's settings, which the groups made from it share.
  struct Options {
    // How long creation and each collective wait for peers. Default: 60 s.
    absl::Duration timeout = absl::Seconds(60);
    // CUDA device index; -1 selects the rendezvous's local rank. Default: -1.
    int device = -1;
    // Default: kMappedHost.
    CpuStaging cpu_staging = CpuStaging::kMappedHost;
    // Whether CPU tensors of at most 64 KiB per member take the host lane when every member of
    // the group is on this host (same boot, IPC and PID namespaces). false: they always go
    // through NCCL, staged as cpu_staging says. Default: true.
    bool host_lane = true;
  };

  // The world communicator of the rendezvous's processes. Collective over every process.
  // kInvalidArgument when the device does not exist (naming the index and the device count).
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      std::shared_ptr<Rendezvous> rendezvous, Options options);

  ~NcclCommunicator() override;

  // The CUDA device this communicator runs on.
  int device() const;
  // Whether small CPU tensors of this group take the host lane (Options::host_lane, and every
  // member on this host).
  bool uses_host_lane() const;

  // Communicator::Broadcast over NCCL (see communicator.h).
  absl::Status Broadcast(at::Tensor& tensor, int root) override;
  // Communicator::AllGather over NCCL (see communicator.h).
  absl::StatusOr<std::vector<at::Tensor>> AllGather(const at::Tensor& input) override;
  // CUDA tensors: `then` runs once the all-gather is queued on the current stream, before the
  // wait.
  absl::StatusOr<std::vector<at::Tensor>> AllGatherThen(
      const at::Tensor& input,
      const std::function<absl::Status(const std::vector<at::Tensor>&)>& then) override;
  // Communicator::AllReduceSum over NCCL (see communicator.h).
  absl::Status AllReduceSum(at::Tensor& tensor) override;
  // Communicator::Barrier over NCCL (see communicator.h).
  absl::Status Barrier() override;

 private:
  friend TransportCommunicator;  // constructs the world and every group
  NcclCommunicator(std::shared_ptr<internal::WorldState> world, internal::GroupIdentity identity,
                   std::shared_ptr<internal::NcclTransport> transport,
                   std::unique_ptr<internal::NcclGroup> group);
};

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_NCCL_COMMUNICATOR_H_
