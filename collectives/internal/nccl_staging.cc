#include "collectives/internal/nccl_staging.h"

#include "ATen/ATen.h"
#include "base/cuda_boundary.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"

namespace lockstep {
namespace collectives {
namespace internal {
namespace {

absl::Status Copy(void* to, const void* from, int64_t bytes, cudaMemcpyKind kind,
                  cudaStream_t stream, const std::string& what) {
  if (cudaError_t e = cudaMemcpyAsync(to, from, bytes, kind, stream); e != cudaSuccess) {
    return CudaStatus(e, what);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status NcclStaging::Reserve(int64_t bytes, const std::string& what) {
  if (bytes <= capacity_) return absl::OkStatus();
  if (mode_ == NcclCommunicator::CpuStaging::kMappedHost) {
    FreeMapped();
    void* host = nullptr;
    if (cudaError_t e = cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
        e != cudaSuccess) {
      return CudaStatus(e, what + ": allocating mapped staging memory");
    }
    void* alias = nullptr;
    if (cudaError_t e = cudaHostGetDevicePointer(&alias, host, 0); e != cudaSuccess) {
      cudaFreeHost(host);
      return CudaStatus(e, what + ": mapping staging memory into the device");
    }
    mapped_host_ = static_cast<char*>(host);
    mapped_device_ = static_cast<char*>(alias);
  } else {
    LOCKSTEP_RETURN_IF_ERROR(CallTorch(what + ": allocating staging buffers", [&] {
      host_ = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      device_buffer_ = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(
                                              at::kCUDA, static_cast<c10::DeviceIndex>(device_)));
    }));
  }
  capacity_ = bytes;
  return absl::OkStatus();
}

char* NcclStaging::host() {
  return mode_ == NcclCommunicator::CpuStaging::kMappedHost ? mapped_host_
                                                            : static_cast<char*>(host_.data_ptr());
}

char* NcclStaging::nccl() {
  return mode_ == NcclCommunicator::CpuStaging::kMappedHost
             ? mapped_device_
             : static_cast<char*>(device_buffer_.data_ptr());
}

absl::Status NcclStaging::BeforeCollective(int64_t offset, int64_t bytes, cudaStream_t stream,
                                           const std::string& what) {
  if (mode_ == NcclCommunicator::CpuStaging::kMappedHost || bytes == 0) return absl::OkStatus();
  return Copy(nccl() + offset, host() + offset, bytes, cudaMemcpyHostToDevice, stream,
              what + ": staging to the device");
}

absl::Status NcclStaging::AfterCollective(int64_t offset, int64_t bytes, cudaStream_t stream,
                                          const std::string& what) {
  if (mode_ == NcclCommunicator::CpuStaging::kMappedHost || bytes == 0) return absl::OkStatus();
  return Copy(host() + offset, nccl() + offset, bytes, cudaMemcpyDeviceToHost, stream,
              what + ": copying back");
}

void NcclStaging::FreeMapped() {
  if (mapped_host_ != nullptr) cudaFreeHost(mapped_host_);
  mapped_host_ = mapped_device_ = nullptr;
}

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep
