#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/cuda_boundary.h"
#include "base/element_type_of.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"
#include "numerics/internal/chunk_hash_device.h"
#include "numerics/internal/chunk_hash_kernel.h"
#include "numerics/internal/summary_kernel.h"
#include "numerics/internal/xxh3_chunk.h"

namespace lockstep {
namespace numerics {
namespace internal {

absl::StatusOr<ChunkHashes> HashChunksOnDevices(absl::Span<const at::Tensor> tensors) {
  // Each tensor's contiguous, 8-byte aligned bytes (kept alive until the batch's copy is done),
  // its chunk count and its first chunk in its device's buffer.
  struct Job {
    at::Tensor bytes;
    uint64_t num_bytes = 0;
    int64_t chunks = 0;
    int64_t first = 0;
  };
  std::vector<Job> jobs(tensors.size());
  std::map<c10::DeviceIndex, int64_t> chunks_on;  // per device: chunks so far
  ChunkHashes hashes;
  hashes.of_tensor.resize(tensors.size());
  absl::Status launched = absl::OkStatus();
  const absl::Status status = CallTorch("hashing CUDA tensors' digest chunks", [&] {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const at::Tensor& tensor = tensors[i];
      if (!tensor.is_cuda()) {
        launched = absl::FailedPreconditionError(
            absl::StrCat("digesting tensor ", i, " on ", tensor.device().str(),
                         ": only CPU and CUDA tensors can be digested"));
        return;
      }
      Job& job = jobs[i];
      c10::cuda::CUDAGuard guard(tensor.device());
      job.bytes = tensor.contiguous();
      if (reinterpret_cast<uintptr_t>(job.bytes.data_ptr()) % 8 != 0) job.bytes = job.bytes.clone();
      job.num_bytes = static_cast<uint64_t>(job.bytes.numel()) * job.bytes.element_size();
      job.chunks = static_cast<int64_t>((job.num_bytes + kXxh3ChunkBytes - 1) / kXxh3ChunkBytes);
      job.first = chunks_on[tensor.device().index()];
      chunks_on[tensor.device().index()] += job.chunks;
    }
    for (const auto& [device, total] : chunks_on) {
      if (total == 0) continue;
      c10::cuda::CUDAGuard guard(c10::Device(c10::kCUDA, device));
      at::Tensor out =
          at::empty({16 * total}, at::TensorOptions().dtype(at::kByte).device(c10::kCUDA, device));
      const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
      // One launch for the whole batch (a single small tensor's kernel would leave most of the
      // GPU idle): the segment table goes to the device first, on the same stream.
      std::vector<ChunkHashSegment> segments;
      for (const Job& job : jobs) {
        if (job.bytes.device().index() != device || job.chunks == 0) continue;
        segments.push_back({static_cast<const uint8_t*>(job.bytes.data_ptr()), job.num_bytes,
                            static_cast<uint64_t>(job.first)});
      }
      const int64_t table_bytes = static_cast<int64_t>(segments.size() * sizeof(ChunkHashSegment));
      at::Tensor table = at::from_blob(segments.data(), {table_bytes}, at::kByte)
                             .to(at::TensorOptions().dtype(at::kByte).device(c10::kCUDA, device));
      const cudaError_t error = LaunchSegmentedChunkHash(
          reinterpret_cast<const ChunkHashSegment*>(table.data_ptr<uint8_t>()),
          static_cast<int>(segments.size()), static_cast<uint64_t>(total), out.data_ptr<uint8_t>(),
          stream);
      if (error != cudaSuccess) {
        launched = CudaStatus(error, "launching the batched chunk hash kernel");
        return;
      }
      // Page-locked, so that the copy runs at the link's speed (the caching host allocator
      // keeps the buffer for the next batch); the batch's one wait on this device.
      at::Tensor host =
          at::empty({16 * total}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      host.copy_(out, /*non_blocking=*/true);
      c10::cuda::getCurrentCUDAStream(device).synchronize();
      const char* all = static_cast<const char*>(host.data_ptr());
      for (size_t i = 0; i < jobs.size(); ++i) {
        if (jobs[i].bytes.device().index() != device) continue;
        hashes.of_tensor[i] =
            absl::string_view(all + 16 * jobs[i].first, static_cast<size_t>(16 * jobs[i].chunks));
      }
      hashes.buffers.push_back(std::move(host));
    }
  });
  if (!status.ok()) return status;
  if (!launched.ok()) return launched;
  return hashes;
}

absl::StatusOr<at::Tensor> EnqueueChunkHashes(const at::Tensor& tensor) {
  LOCKSTEP_ASSIGN_OR_RETURN(EnqueuedDigest enqueued,
                            EnqueueTensorDigest(tensor, /*summarize=*/false));
  return std::move(enqueued.hashes);
}

absl::StatusOr<EnqueuedDigest> EnqueueTensorDigest(const at::Tensor& tensor, bool summarize) {
  if (!tensor.is_cuda()) {
    return absl::FailedPreconditionError(absl::StrCat("enqueuing the chunk hashes of a tensor on ",
                                                      tensor.device().str(),
                                                      ": only CUDA tensors"));
  }
  EnqueuedDigest enqueued;
  absl::Status launched = absl::OkStatus();
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("enqueuing a CUDA tensor's digest chunk hashes", [&] {
    c10::cuda::CUDAGuard guard(tensor.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    at::Tensor bytes = tensor.contiguous();
    if (reinterpret_cast<uintptr_t>(bytes.data_ptr()) % 8 != 0) bytes = bytes.clone();
    const uint64_t num_bytes = static_cast<uint64_t>(bytes.numel()) * bytes.element_size();
    const int64_t chunks =
        static_cast<int64_t>((num_bytes + kXxh3ChunkBytes - 1) / kXxh3ChunkBytes);
    const at::TensorOptions on_device =
        at::TensorOptions().dtype(at::kByte).device(tensor.device());
    enqueued.hashes = at::empty({16 * chunks}, on_device);
    if (chunks == 0) return;
    // `bytes`, when a copy, is released to the caching allocator at once: it reuses the block
    // only for work queued on this stream after the kernels.
    cudaError_t error = LaunchChunkHash(static_cast<const uint8_t*>(bytes.data_ptr()), num_bytes,
                                        enqueued.hashes.data_ptr<uint8_t>(), stream);
    if (error != cudaSuccess) {
      launched = CudaStatus(error, "launching the chunk hash kernel");
      return;
    }
    const std::optional<ElementType> type = ElementTypeOf(bytes.scalar_type());
    if (!summarize || !type) return;
    const uint64_t count = static_cast<uint64_t>(bytes.numel());
    enqueued.summary = at::empty({16 * static_cast<int64_t>(SummaryPartials(count))}, on_device);
    error = LaunchSummary(bytes.data_ptr(), count, *type,
                          reinterpret_cast<double*>(enqueued.summary.data_ptr<uint8_t>()), stream);
    if (error != cudaSuccess) launched = CudaStatus(error, "launching the summary kernel");
  }));
  if (!launched.ok()) return launched;
  return enqueued;
}

absl::StatusOr<ChunkHashes> CollectChunkHashes(absl::Span<const at::Tensor> device_hashes) {
  ChunkHashes hashes;
  hashes.of_tensor.resize(device_hashes.size());
  const absl::Status status = CallTorch("copying CUDA digest chunk hashes back", [&] {
    std::map<c10::DeviceIndex, std::vector<size_t>> on;  // per device: the tensors' indices
    for (size_t i = 0; i < device_hashes.size(); ++i) {
      if (device_hashes[i].numel() > 0) on[device_hashes[i].device().index()].push_back(i);
    }
    for (const auto& [device, indices] : on) {
      c10::cuda::CUDAGuard guard(c10::Device(c10::kCUDA, device));
      std::vector<at::Tensor> parts;
      for (size_t i : indices) parts.push_back(device_hashes[i]);
      const at::Tensor all = at::cat(parts);
      at::Tensor host =
          at::empty({all.numel()}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      host.copy_(all, /*non_blocking=*/true);
      c10::cuda::getCurrentCUDAStream(device).synchronize();
      const char* bytes = static_cast<const char*>(host.data_ptr());
      size_t offset = 0;
      for (size_t i : indices) {
        const size_t n = static_cast<size_t>(device_hashes[i].numel());
        hashes.of_tensor[i] = absl::string_view(bytes + offset, n);
        offset += n;
      }
      hashes.buffers.push_back(std::move(host));
    }
  });
  if (!status.ok()) return status;
  return hashes;
}

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
