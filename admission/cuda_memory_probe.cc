#include "admission/cuda_memory_probe.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "base/cuda_boundary.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "c10/core/Allocator.h"
#include "c10/cuda/CUDACachingAllocator.h"
#include "c10/cuda/CUDAFunctions.h"
#include "c10/cuda/CUDAGuard.h"

namespace lockstep {
namespace admission {

absl::StatusOr<std::unique_ptr<CudaMemoryProbe>> CudaMemoryProbe::Create(int device) {
  const int count = c10::cuda::device_count();
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA memory probe: device ", device,
                                                   " does not exist (", count, " devices)"));
  }
  return std::unique_ptr<CudaMemoryProbe>(new CudaMemoryProbe(device));
}

std::string CudaMemoryProbe::DeviceName() const { return absl::StrCat("cuda:", device_); }

absl::Status CudaMemoryProbe::ResetPeak() {
  return CallTorch(absl::StrCat("resetting the peak memory statistics of ", DeviceName()), [&] {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device_));
  });
}

absl::StatusOr<MemoryReading> CudaMemoryProbe::Read() {
  MemoryReading reading;
  absl::Status status =
      CallTorch(absl::StrCat("reading the memory statistics of ", DeviceName()), [&] {
        const auto stats =
            c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device_));
        const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
        reading.peak_allocated_bytes = stats.allocated_bytes[all].peak;
        reading.peak_reserved_bytes = stats.reserved_bytes[all].peak;
        reading.allocated_bytes = stats.allocated_bytes[all].current;
      });
  if (!status.ok()) return status;
  return reading;
}

absl::Status CudaMemoryProbe::ReleaseCachedMemory() {
  return CallTorch(absl::StrCat("releasing cached memory of ", DeviceName()), [&] {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    c10::cuda::CUDACachingAllocator::emptyCache();
  });
}

absl::StatusOr<int64_t> CudaMemoryProbe::DeviceTotalBytes() {
  size_t free_bytes = 0, total_bytes = 0;
  int previous = 0;
  LOCKSTEP_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&previous), "reading the current CUDA device"));
  LOCKSTEP_RETURN_IF_ERROR(
      CudaStatus(cudaSetDevice(device_), absl::StrCat("selecting ", DeviceName())));
  const cudaError_t error = cudaMemGetInfo(&free_bytes, &total_bytes);
  const absl::Status restored =
      CudaStatus(cudaSetDevice(previous), "selecting the previous CUDA device again");
  LOCKSTEP_RETURN_IF_ERROR(CudaStatus(error, absl::StrCat("cudaMemGetInfo on ", DeviceName())));
  LOCKSTEP_RETURN_IF_ERROR(restored);
  return static_cast<int64_t>(total_bytes);
}

}  // namespace admission
}  // namespace lockstep
