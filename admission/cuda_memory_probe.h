// admission/cuda_memory_probe.h (--config=cuda)
//
// CudaMemoryProbe: the MemoryProbe of one CUDA device, over LibTorch's CUDA caching allocator.
// ResetPeak resets the allocator's peak statistics of the device; Read gives the peak bytes
// allocated to tensors and reserved from the device since then, and the bytes allocated now;
// ReleaseCachedMemory returns the allocator's unused cached blocks to the device (emptyCache);
// DeviceTotalBytes is the device's total memory (cudaMemGetInfo).
//
// Readings cover every allocation through the caching allocator on that device (all threads and
// streams of the process), not memory allocated outside it (NCCL buffers, cuBLAS workspaces made
// by other libraries, other processes).

#ifndef LOCKSTEP_ADMISSION_CUDA_MEMORY_PROBE_H_
#define LOCKSTEP_ADMISSION_CUDA_MEMORY_PROBE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "admission/memory_probe.h"

namespace lockstep {
namespace admission {

// The MemoryProbe of one CUDA device, over LibTorch's caching allocator (see the top of this
// file).
class CudaMemoryProbe : public MemoryProbe {
 public:
  // kInvalidArgument naming the device and the device count if `device` does not exist.
  static absl::StatusOr<std::unique_ptr<CudaMemoryProbe>> Create(int device);

  absl::Status ResetPeak() override;
  absl::StatusOr<MemoryReading> Read() override;
  absl::Status ReleaseCachedMemory() override;
  absl::StatusOr<int64_t> DeviceTotalBytes() override;
  std::string DeviceName() const override;

 private:
  explicit CudaMemoryProbe(int device) : device_(device) {}
  int device_;
};

}  // namespace admission
}  // namespace lockstep

#endif  // LOCKSTEP_ADMISSION_CUDA_MEMORY_PROBE_H_
