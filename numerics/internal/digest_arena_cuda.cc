// numerics/internal/digest_arena_cuda.cc: a DigestArena's launches and collection on CUDA
// devices (digest_arena.h, Note [Digest arena]).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/cuda_boundary.h"
#include "base/element_type_of.h"
#include "base/torch_boundary.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"
#include "numerics/internal/chunk_hash_kernel.h"
#include "numerics/internal/digest_arena.h"
#include "numerics/internal/summary_kernel.h"
#include "numerics/internal/xxh3_chunk.h"

namespace lockstep {
namespace numerics {
namespace internal {

absl::StatusOr<std::vector<DigestArena::Pending>> DigestArena::Enqueue(absl::Span<const Job> jobs) {
  std::vector<Pending> pending(jobs.size());
  absl::Status launched = absl::OkStatus();
  const absl::Status status = CallTorch("enqueuing CUDA tensors' digests", [&] {
    std::vector<bool> done(jobs.size(), false);
    for (size_t lead = 0; lead < jobs.size() && launched.ok(); ++lead) {
      if (done[lead]) continue;
      // Every job on the lead job's stream, in batches of up to kInlineChunkHashSegments.
      const at::Device device = jobs[lead].tensor.device();
      if (!device.is_cuda() || jobs[lead].stream.device() != device) {
        launched = absl::FailedPreconditionError(
            absl::StrCat("enqueuing the digest of a tensor on ", device.str(), " on a stream of ",
                         jobs[lead].stream.device().str(), ": only CUDA, on its own device"));
        return;
      }
      const c10::cuda::CUDAStream stream(jobs[lead].stream);
      // The copies of non-contiguous tensors, and the blocks, on that stream too.
      const c10::cuda::CUDAStreamGuard guard(stream);
      if (std::find(streams_.begin(), streams_.end(), jobs[lead].stream) == streams_.end()) {
        streams_.push_back(jobs[lead].stream);
      }
      std::vector<ChunkHashSegment> segments;
      std::vector<size_t> batch;     // the jobs of `segments`
      std::vector<at::Tensor> keep;  // contiguous copies, until their launch is enqueued
      uint64_t total_chunks = 0;
      const auto launch = [&] {
        if (segments.empty() || !launched.ok()) return;
        const Slice all = Take(jobs[lead].stream, static_cast<int64_t>(16 * total_chunks));
        const cudaError_t error =
            LaunchInlineChunkHash(segments.data(), static_cast<int>(segments.size()), total_chunks,
                                  Address(all), stream.stream());
        if (error != cudaSuccess) {
          launched = CudaStatus(error, "launching the chunk hash kernel");
          return;
        }
        for (size_t k = 0; k < batch.size(); ++k) {
          const int64_t first = static_cast<int64_t>(segments[k].first_chunk);
          const int64_t chunks =
              static_cast<int64_t>((segments[k].num_bytes + kXxh3ChunkBytes - 1) / kXxh3ChunkBytes);
          pending[batch[k]].hashes = Slice{all.block, all.offset + 16 * first, 16 * chunks};
        }
        segments.clear();
        batch.clear();
        keep.clear();
        total_chunks = 0;
      };
      for (size_t i = lead; i < jobs.size() && launched.ok(); ++i) {
        if (done[i] || jobs[i].stream != jobs[lead].stream) continue;
        done[i] = true;
        at::Tensor bytes = jobs[i].tensor.contiguous();
        if (reinterpret_cast<uintptr_t>(bytes.data_ptr()) % 8 != 0) bytes = bytes.clone();
        const uint64_t num_bytes = static_cast<uint64_t>(bytes.numel()) * bytes.element_size();
        if (num_bytes > 0) {
          segments.push_back(
              {static_cast<const uint8_t*>(bytes.data_ptr()), num_bytes, total_chunks});
          batch.push_back(i);
          total_chunks += (num_bytes + kXxh3ChunkBytes - 1) / kXxh3ChunkBytes;
        }
        const std::optional<ElementType> type = ElementTypeOf(bytes.scalar_type());
        if (jobs[i].summarize && type && bytes.numel() > 0) {
          const uint64_t count = static_cast<uint64_t>(bytes.numel());
          const Slice summary =
              Take(jobs[lead].stream, 16 * static_cast<int64_t>(SummaryPartials(count)));
          const cudaError_t error =
              LaunchSummary(bytes.data_ptr(), count, *type,
                            reinterpret_cast<double*>(Address(summary)), stream.stream());
          if (error != cudaSuccess) {
            launched = CudaStatus(error, "launching the summary kernel");
            return;
          }
          pending[i].summary = summary;
          pending[i].summarized = true;
        }
        keep.push_back(std::move(bytes));
        if (static_cast<int>(segments.size()) == kInlineChunkHashSegments) launch();
      }
      launch();
    }
  });
  if (!status.ok()) return status;
  if (!launched.ok()) return launched;
  return pending;
}

absl::Status DigestArena::Collect() {
  absl::Status copied = absl::OkStatus();
  const absl::Status status = CallTorch("copying the operator recorder's digests back", [&] {
    for (const c10::Stream& stream : streams_) c10::cuda::CUDAStream(stream).synchronize();
    for (Block& block : blocks_) {
      if (block.used == 0) continue;
      if (!block.host.defined()) {
        block.host = at::empty({block.device.numel()},
                               at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      }
      c10::cuda::CUDAGuard guard(block.device.device());
      const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream();
      cudaError_t error =
          cudaMemcpyAsync(block.host.data_ptr(), block.device.data_ptr(),
                          static_cast<size_t>(block.used), cudaMemcpyDeviceToHost, stream.stream());
      if (error == cudaSuccess) error = cudaStreamSynchronize(stream.stream());
      if (error != cudaSuccess) {
        copied = CudaStatus(error, "copying the operator recorder's digests back");
        return;
      }
    }
  });
  if (!status.ok()) return status;
  return copied;
}

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
