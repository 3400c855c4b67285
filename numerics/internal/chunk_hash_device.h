// numerics/internal/chunk_hash_device.h
//
// Private to numerics/: the digest chunk hashes of a tensor on a device (DIGEST.md step 2),
// computed there: the CUDA kernel under --config=cuda, a refusal in CPU-only builds (where no
// CUDA tensor can exist).

#ifndef LOCKSTEP_NUMERICS_INTERNAL_CHUNK_HASH_DEVICE_H_
#define LOCKSTEP_NUMERICS_INTERNAL_CHUNK_HASH_DEVICE_H_

#include <functional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace lockstep {
namespace numerics {
namespace internal {

// The chunk hashes of a batch of tensors, back on the host.
struct ChunkHashes {
  // Page-locked host buffers (one per device) that the views below point into.
  std::vector<at::Tensor> buffers;
  // Per tensor: 16 bytes per chunk of its logical contiguous bytes, in chunk order.
  std::vector<absl::string_view> of_tensor;
};

// Where part of a batch's chunk hashes landed on the host: tensor `tensor`'s hashes in one piece
// (16 bytes per chunk, in chunk order, continuing its earlier pieces), and whether they are its
// last.
struct LandedHashes {
  size_t tensor;  // an index into the batch
  absl::string_view hashes;
  bool last;
};

// The chunk hashes of each tensor (all CUDA tensors), handed to `consume` as they land (Note
// [Hashes in pieces] in chunk_hash_cuda.cc): per device, its tensors hashed by one kernel over
// all their chunks (Note [Batched digests] in digest.cc) on its current stream, launched in
// pieces, each piece's hashes copied back into page-locked memory while the next is hashed.
// `consume` runs on this thread, one call per piece, in chunk order; a tensor without bytes is
// handed over once, empty and last. Its views live until it returns. kFailedPrecondition for a
// device this build cannot hash on; an error `consume` returns ends the stream and is returned.
// A non-contiguous tensor (or one at an offset that is not a multiple of 8 bytes) is copied to a
// contiguous buffer that lives until the batch is done, so such tensors cost their size in
// device memory meanwhile.
absl::Status StreamChunkHashes(
    absl::Span<const at::Tensor> tensors,
    const std::function<absl::Status(absl::Span<const LandedHashes>)>& consume);

// The chunk hashes of one CUDA tensor as it is when its device's current stream reaches them,
// enqueued there and not waited for: a uint8 tensor of 16 bytes per chunk on the tensor's device
// (empty for an empty tensor). No host synchronization; a non-contiguous tensor is copied first,
// on the same stream. CollectChunkHashes brings a batch of them back.
absl::StatusOr<at::Tensor> EnqueueChunkHashes(const at::Tensor& tensor);

// A CUDA tensor's pending digest and, when asked for, its pending summary.
struct EnqueuedDigest {
  at::Tensor hashes;  // as EnqueueChunkHashes returns them
  // With `summarize`: its sum and max |x| as partials, a uint8 tensor on the tensor's device of
  // 16 bytes per partial (Note [Summary partials] in summary_kernel.h), which
  // FinishSummaryPartials (summary_partials.h) finishes once back. Undefined for an empty tensor
  // and for a dtype the kernel does not read (element_type_of.h): the caller summarizes those
  // itself.
  at::Tensor summary;
};

// EnqueueChunkHashes, and with `summarize` the summary kernel over the same contiguous bytes
// (a non-contiguous tensor is copied once for both), on the same stream, not waited for.
absl::StatusOr<EnqueuedDigest> EnqueueTensorDigest(const at::Tensor& tensor, bool summarize);

// EnqueueChunkHashes's (and EnqueueTensorDigest's summaries': any uint8 device tensors) results,
// back on the host: one copy and one wait per device.
absl::StatusOr<ChunkHashes> CollectChunkHashes(absl::Span<const at::Tensor> device_hashes);

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_INTERNAL_CHUNK_HASH_DEVICE_H_
