// collectives/internal/nccl_calls.h  (private to //collectives:nccl_communicator)
//
// The discipline every NCCL call of lockstep's NCCL communicator follows: its errors as statuses
// by what the caller does next, waits bounded by the communicator's timeout (a late or dead peer
// aborts the communicator instead of hanging), collectives enqueued before anything queued after
// them (Note [Non-blocking enqueue]), and communicators created from an id exchanged through the
// rendezvous store.
//
// Thread-safety: as the communicator's (one thread at a time per ncclComm_t).

#ifndef LOCKSTEP_COLLECTIVES_INTERNAL_NCCL_CALLS_H_
#define LOCKSTEP_COLLECTIVES_INTERNAL_NCCL_CALLS_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "collectives/internal/communicator_base.h"
#include "collectives/rendezvous.h"

namespace lockstep {
namespace collectives {
namespace internal {

// `result` as a status naming `what` and NCCL's own words (with `comm`'s last error when given):
// kUnavailable for a remote or system error, kInvalidArgument for bad arguments or usage,
// kInternal otherwise.
absl::Status NcclError(const std::string& what, ncclResult_t result, ncclComm_t comm);

// Aborts `comm` (when not null), sets it to null and returns `error`.
absl::Status Abort(ncclComm_t& comm, absl::Status error);

// Polls until `comm` leaves ncclInProgress (check_stream false: the operation is enqueued) or,
// with check_stream, until the stream is idle. The stream is polled every round and NCCL's
// asynchronous error state every 32nd (it takes a lock), so a completed collective is seen within
// a microsecond or two while a failed or late peer still ends the wait. On timeout or error the
// communicator is aborted.
absl::Status Await(ncclComm_t& comm, cudaStream_t stream, bool check_stream, absl::Duration timeout,
                   const std::string& what);

// Note [Non-blocking enqueue]
// lockstep's NCCL communicators are non-blocking (config.blocking = 0), so that no call can
// hang. In that mode a collective may return ncclInProgress before NCCL has enqueued its kernel
// on the stream. Anything queued on the stream right after it — the device-to-host copy of a
// staged result, the next collective — could then run before the collective does and read its
// stale input. So every collective call goes through Enqueue, which, on ncclInProgress, waits
// for the communicator's state to leave ncclInProgress (the kernel is then on the stream)
// before the caller queues more work. Seen on two H200s: a broadcast receiver copied its
// staging buffer back before the broadcast ran and "received" stale bytes.
template <typename Launch>
absl::Status Enqueue(ncclComm_t& comm, cudaStream_t stream, absl::Duration timeout,
                     const std::string& what, const Launch& launch) {
  const ncclResult_t result = launch(comm, stream);
  if (result == ncclSuccess) return absl::OkStatus();
  if (result != ncclInProgress) return Abort(comm, NcclError(what, result, comm));
  return Await(comm, stream, /*check_stream=*/false, timeout, what);
}

// The NCCL type of `type`; kInvalidArgument naming it for a dtype NCCL cannot move.
absl::StatusOr<ncclDataType_t> NcclType(at::ScalarType type, const std::string& what);

// Checks a collective's tensor: defined, contiguous, on the CPU or on this device.
absl::Status CheckTensor(const at::Tensor& tensor, int device, const std::string& what);

// Initializes a communicator of `n` ranks with `id`, non-blocking, bounded by `timeout`.
absl::Status InitComm(ncclComm_t& comm, int n, const ncclUniqueId& id, int rank,
                      absl::Duration timeout, const std::string& what);

// The NCCL unique id of one communicator of `identity`: its first member makes it and publishes
// it under the group's store key + `suffix`, the others read it.
absl::StatusOr<ncclUniqueId> ExchangeUniqueId(Rendezvous& rendezvous, const GroupIdentity& identity,
                                              absl::string_view suffix, const std::string& what);

// Creates the NCCL communicator of `identity` on `device` (ExchangeUniqueId, then InitComm).
absl::Status CreateComm(Rendezvous& rendezvous, const GroupIdentity& identity, int device,
                        absl::Duration timeout, ncclComm_t& comm);

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_INTERNAL_NCCL_CALLS_H_
