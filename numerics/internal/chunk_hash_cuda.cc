#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/cuda/CUDAEvent.h"
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

// Note [Hashes in pieces]
// A batch's digests are the device's work (hashing the chunks) and then the host's (copying the
// hashes back and streaming each tensor's through its record hash, digest.cc). Launched whole,
// all of the host's work waits for all of the device's. Launched in pieces of equal chunk counts,
// each piece's hashes are copied back on a second stream as soon as that piece is hashed, while
// the next piece is hashed, and the host consumes them meanwhile: only the last piece's copy and
// host work follow the device's. A piece is at least kPieceBytes of tensor bytes (a launch that
// small still fills the GPU), and a batch has at most kMaxPieces.
constexpr uint64_t kPieceBytes = uint64_t{64} << 20;
constexpr int64_t kMaxPieces = 8;

absl::Status StreamChunkHashes(
    absl::Span<const at::Tensor> tensors,
    const std::function<absl::Status(absl::Span<const LandedHashes>)>& consume) {
  // Each tensor's contiguous, 8-byte aligned bytes (kept alive until the batch's copies are done),
  // its chunk count and its first chunk in its device's buffer.
  struct Job {
    at::Tensor bytes;
    uint64_t num_bytes = 0;
    int64_t chunks = 0;
    int64_t first = 0;
  };
  std::vector<Job> jobs(tensors.size());
  std::map<c10::DeviceIndex, int64_t> chunks_on;  // per device: chunks so far
  absl::Status failed = absl::OkStatus();
  const absl::Status status = CallTorch("hashing CUDA tensors' digest chunks", [&] {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const at::Tensor& tensor = tensors[i];
      if (!tensor.is_cuda()) {
        failed = absl::FailedPreconditionError(
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
      c10::cuda::CUDAGuard guard(c10::Device(c10::kCUDA, device));
      std::vector<size_t> mine;  // this device's tensors with bytes, in chunk order
      std::vector<LandedHashes> landed;
      std::vector<ChunkHashSegment> segments;
      for (size_t i = 0; i < jobs.size(); ++i) {
        if (jobs[i].bytes.device().index() != device) continue;
        if (jobs[i].chunks == 0) {
          landed.push_back({i, absl::string_view(), true});
          continue;
        }
        mine.push_back(i);
        segments.push_back({static_cast<const uint8_t*>(jobs[i].bytes.data_ptr()),
                            jobs[i].num_bytes, static_cast<uint64_t>(jobs[i].first)});
      }
      if (!landed.empty()) {
        failed = consume(landed);
        if (!failed.ok()) return;
      }
      if (total == 0) continue;
      const at::TensorOptions on_device =
          at::TensorOptions().dtype(at::kByte).device(c10::kCUDA, device);
      at::Tensor out = at::empty({16 * total}, on_device);
      // Page-locked, so that the copies run at the link's speed (the caching host allocator
      // keeps the buffer for the next batch).
      at::Tensor host =
          at::empty({16 * total}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device);
      const c10::cuda::CUDAStream copies = c10::cuda::getStreamFromPool(false, device);
      // More segments than the kernel's argument holds go to the device first, on the stream.
      at::Tensor table;
      if (segments.size() > static_cast<size_t>(kInlineChunkHashSegments)) {
        table = at::from_blob(segments.data(),
                              {static_cast<int64_t>(segments.size() * sizeof(ChunkHashSegment))},
                              at::kByte)
                    .to(on_device);
      }
      const int64_t pieces = std::max<int64_t>(
          1, std::min<int64_t>(kMaxPieces,
                               static_cast<int64_t>(total * kXxh3ChunkBytes / kPieceBytes)));
      std::vector<at::cuda::CUDAEvent> hashed(pieces), copied(pieces);
      std::vector<int64_t> bound(pieces + 1);
      for (int64_t p = 0; p <= pieces; ++p) bound[p] = total * p / pieces;
      for (int64_t p = 0; p < pieces; ++p) {
        const cudaError_t error =
            table.defined()
                ? LaunchSegmentedChunkHashRange(
                      reinterpret_cast<const ChunkHashSegment*>(table.data_ptr<uint8_t>()),
                      static_cast<int>(segments.size()), bound[p], bound[p + 1],
                      out.data_ptr<uint8_t>(), stream.stream())
                : LaunchInlineChunkHashRange(segments.data(), static_cast<int>(segments.size()),
                                             bound[p], bound[p + 1], out.data_ptr<uint8_t>(),
                                             stream.stream());
        if (error != cudaSuccess) {
          failed = CudaStatus(error, "launching the batched chunk hash kernel");
          break;
        }
        hashed[p].record(stream);
        hashed[p].block(copies);
        const c10::cuda::CUDAStreamGuard on_copies(copies);
        host.narrow(0, 16 * bound[p], 16 * (bound[p + 1] - bound[p]))
            .copy_(out.narrow(0, 16 * bound[p], 16 * (bound[p + 1] - bound[p])),
                   /*non_blocking=*/true);
        copied[p].record(copies);
      }
      const char* all = static_cast<const char*>(host.data_ptr());
      size_t next = 0;  // the first of `mine` not yet handed over whole
      for (int64_t p = 0; failed.ok() && p < pieces; ++p) {
        copied[p].synchronize();
        landed.clear();
        for (size_t m = next; m < mine.size(); ++m) {
          const Job& job = jobs[mine[m]];
          const int64_t begin = std::max(job.first, bound[p]);
          const int64_t end = std::min(job.first + job.chunks, bound[p + 1]);
          if (begin >= end) break;
          const bool last = job.first + job.chunks <= bound[p + 1];
          landed.push_back(
              {mine[m], absl::string_view(all + 16 * begin, 16 * (end - begin)), last});
          if (last) next = m + 1;
        }
        failed = consume(landed);
      }
      // `out` and `host` are released only once the copy stream is done with them (on an early
      // end too).
      copies.synchronize();
      if (!failed.ok()) return;
    }
  });
  if (!status.ok()) return status;
  return failed;
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
