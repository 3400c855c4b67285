// collectives/internal/nccl_staging.h  (private to //collectives:nccl_communicator)
//
// Note [CPU staging]
// How a CPU tensor reaches NCCL, per communicator, grown on demand and reused (each collective
// completes before the next may use the buffers):
//   kMappedHost   one pinned host buffer, mapped into the device's address space; NCCL's kernels
//                 read and write it directly (zero-copy), so nothing but the collective is
//                 queued and one wait covers it. For the small, latency-bound tensors lockstep
//                 moves (RNG states, digests) this saves two copies and their scheduling.
//   kDeviceCopies a pinned host buffer and a device buffer; the upload, the collective and the
//                 download are queued on one stream and waited for once.
//
// Thread-safety: as its communicator's (one thread at a time).

#ifndef LOCKSTEP_COLLECTIVES_INTERNAL_NCCL_STAGING_H_
#define LOCKSTEP_COLLECTIVES_INTERNAL_NCCL_STAGING_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "collectives/nccl_communicator.h"

namespace lockstep {
namespace collectives {
namespace internal {

// The staging buffers of one NCCL communicator (Note [CPU staging]).
class NcclStaging {
 public:
  NcclStaging(NcclCommunicator::CpuStaging mode, int device) : mode_(mode), device_(device) {}
  ~NcclStaging() { FreeMapped(); }
  NcclStaging(const NcclStaging&) = delete;
  NcclStaging& operator=(const NcclStaging&) = delete;

  // Makes room for `bytes` bytes.
  absl::Status Reserve(int64_t bytes, const std::string& what);
  // Where the CPU side reads and writes.
  char* host();
  // The address NCCL operates on.
  char* nccl();
  // Queues what must precede NCCL's reads of [offset, offset + bytes).
  absl::Status BeforeCollective(int64_t offset, int64_t bytes, cudaStream_t stream,
                                const std::string& what);
  // Queues what must follow NCCL's writes of [offset, offset + bytes).
  absl::Status AfterCollective(int64_t offset, int64_t bytes, cudaStream_t stream,
                               const std::string& what);

 private:
  void FreeMapped();

  NcclCommunicator::CpuStaging mode_;
  int device_;
  int64_t capacity_ = 0;
  char* mapped_host_ = nullptr;    // kMappedHost
  char* mapped_device_ = nullptr;  // its device alias
  at::Tensor host_;                // kDeviceCopies
  at::Tensor device_buffer_;
};

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_INTERNAL_NCCL_STAGING_H_
