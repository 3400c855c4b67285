#include <cstdint>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/cuda_boundary.h"
#include "base/torch_boundary.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"
#include "numerics/internal/chunk_hash_device.h"
#include "numerics/internal/chunk_hash_kernel.h"
#include "numerics/internal/xxh3_chunk.h"

namespace lockstep {
namespace numerics {
namespace internal {

absl::StatusOr<std::string> HashChunksOnDevice(const at::Tensor& tensor) {
  if (!tensor.is_cuda()) {
    return absl::FailedPreconditionError(
        absl::StrCat("digesting a tensor on ", tensor.device().str(),
                     ": only CPU and CUDA tensors can be digested"));
  }
  std::string hashes;
  absl::Status launched = absl::OkStatus();
  const absl::Status status = CallTorch("hashing a CUDA tensor's digest chunks", [&] {
    c10::cuda::CUDAGuard guard(tensor.device());
    at::Tensor bytes = tensor.contiguous();
    // The kernel loads 8-byte words: a view at an odd offset is copied to an aligned buffer.
    if (reinterpret_cast<uintptr_t>(bytes.data_ptr()) % 8 != 0) bytes = bytes.clone();
    const uint64_t num_bytes = static_cast<uint64_t>(bytes.numel()) * bytes.element_size();
    const int64_t chunks =
        static_cast<int64_t>((num_bytes + kXxh3ChunkBytes - 1) / kXxh3ChunkBytes);
    if (chunks == 0) return;
    at::Tensor out = at::empty({16 * chunks}, bytes.options().dtype(at::kByte));
    const cudaError_t error = LaunchChunkHash(
        static_cast<const uint8_t*>(bytes.data_ptr()), num_bytes, out.data_ptr<uint8_t>(),
        c10::cuda::getCurrentCUDAStream(tensor.device().index()).stream());
    if (error != cudaSuccess) {
      launched = CudaStatus(error, "launching the chunk hash kernel");
      return;
    }
    const at::Tensor host = out.cpu();
    hashes.assign(static_cast<const char*>(host.data_ptr()), host.numel());
  });
  if (!status.ok()) return status;
  if (!launched.ok()) return launched;
  return hashes;
}

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
