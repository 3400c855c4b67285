// numerics/internal/digest_arena.h  (private to numerics/: the operator recorder's)
//
// Note [Digest arena]
// The operator recorder enqueues device digests inside every operator call (Note [Deferred
// digests] in op_recorder.cc), where each host-side step is paid once per call of the program:
// an at::empty per result (a dispatched call and an allocator lock) and a launch per tensor
// would cost more than many of the calls themselves. A DigestArena hands out slices of device
// blocks it keeps instead (a slice is a bump of an offset; a block comes from the caching
// allocator once and is reused after every Collect), and hashes the tensors of one batch (one
// call's) in one launch with their segments passed as the kernel's argument (no table copied to
// the device first). Collect waits for every stream that enqueued into the arena and copies each
// used block back once.
//
// Thread-safety: none; the recorder holds its mutex around every use.

#ifndef LOCKSTEP_NUMERICS_INTERNAL_DIGEST_ARENA_H_
#define LOCKSTEP_NUMERICS_INTERNAL_DIGEST_ARENA_H_

#include <cstdint>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "c10/core/Stream.h"

namespace lockstep {
namespace numerics {
namespace internal {

class DigestArena {
 public:
  // Bytes [offset, offset + bytes) of block `block`; block -1 is the empty slice.
  struct Slice {
    int block = -1;
    int64_t offset = 0;
    int64_t bytes = 0;
  };
  // A tensor to digest, and whether to summarize it too (its sum and max |x|).
  struct Job {
    at::Tensor tensor;  // a CUDA tensor
    bool summarize = false;
    // Of the tensor's device: where its digest (and any contiguous copy) is enqueued.
    c10::Stream stream = c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::kCPU));
  };
  // Where a job's results will be: its chunk hashes (16 bytes per chunk, in chunk order) and,
  // when `summarized`, its summary partials (Note [Summary partials] in summary_kernel.h). A job
  // asked to summarize an empty tensor, or a dtype the summary kernel does not read, is not
  // summarized here: the caller summarizes it itself.
  struct Pending {
    Slice hashes;
    Slice summary;
    bool summarized = false;
  };

  DigestArena() = default;
  DigestArena(const DigestArena&) = delete;
  DigestArena& operator=(const DigestArena&) = delete;
  // Waits for the streams that enqueued since the last Reset, so that no kernel writes a block
  // freed here.
  ~DigestArena();

  // Enqueues each job's chunk hashes (one launch per stream for up to kInlineChunkHashSegments
  // tensors) and summary on the job's stream, and returns where they will be. A non-contiguous
  // tensor is copied first, on the same stream. Precondition: each tensor stays
  // allocated until its stream passes the launches, or was last used on that stream (the caching
  // allocator then reuses its memory only for work queued after them). kFailedPrecondition in a
  // build without CUDA.
  absl::StatusOr<std::vector<Pending>> Enqueue(absl::Span<const Job> jobs);

  // Waits for every stream that enqueued since the last Reset and copies the used part of each
  // block back to the host. Read is valid from then until Reset.
  absl::Status Collect();

  // A slice's bytes, once collected.
  absl::string_view Read(const Slice& slice) const;

  // Forgets every slice and keeps the blocks for the next round. Precondition: Collect has run
  // since the last Enqueue (the device might still be writing otherwise).
  void Reset();

 private:
  // A block serves one stream: the caching allocator makes memory safe for the stream it was
  // allocated on, not for another stream's kernels that might overlap its previous owner's.
  struct Block {
    c10::Stream stream;
    at::Tensor device;  // uint8, on the stream's device
    at::Tensor host;    // page-locked, as large; allocated at the first Collect that needs it
    int64_t used = 0;
  };
  // A slice of `bytes` for kernels on `stream` (allocating a block when none of its has room).
  // Precondition: `stream` is current on its device.
  Slice Take(const c10::Stream& stream, int64_t bytes);
  uint8_t* Address(const Slice& slice);

  std::vector<Block> blocks_;
  std::vector<c10::Stream> streams_;  // that enqueued since the last Reset
};

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_INTERNAL_DIGEST_ARENA_H_
