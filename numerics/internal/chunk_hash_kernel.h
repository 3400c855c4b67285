// numerics/internal/chunk_hash_kernel.h
//
// Private to numerics/: the CUDA kernel that hashes the digest chunks of a batch of device
// buffers (DIGEST.md step 2) — eight threads per 16 KiB chunk, one XXH3 accumulator lane each —
// compiled by nvcc (chunk_hash_kernel.cu). Plain C++ interface, so nvcc never parses LibTorch.

#ifndef LOCKSTEP_NUMERICS_INTERNAL_CHUNK_HASH_KERNEL_H_
#define LOCKSTEP_NUMERICS_INTERNAL_CHUNK_HASH_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lockstep {
namespace numerics {
namespace internal {

// One buffer of a batch: its bytes (device memory, 8-byte aligned, num_bytes > 0) and where its
// first chunk's hash goes among the batch's chunks.
struct ChunkHashSegment {
  const uint8_t* data;
  uint64_t num_bytes;
  uint64_t first_chunk;
};

// Hashes every segment's chunks in one launch, so that a batch of small buffers fills the GPU:
// chunk j of segment i into out[16 * (first_chunk_i + j) ..) (device memory). `segments` (device
// memory, `count` of them) are ordered by first_chunk, each starting where the one before ends;
// `total_chunks` is the batch's.
cudaError_t LaunchSegmentedChunkHash(const ChunkHashSegment* segments, int count,
                                     uint64_t total_chunks, uint8_t* out, cudaStream_t stream);

// LaunchSegmentedChunkHash of the batch's chunks [chunk_begin, chunk_end) only (their hashes into
// the same places of `out`): a batch hashed in pieces, each copied back while the next is hashed.
cudaError_t LaunchSegmentedChunkHashRange(const ChunkHashSegment* segments, int count,
                                          uint64_t chunk_begin, uint64_t chunk_end, uint8_t* out,
                                          cudaStream_t stream);

// At most this many segments go to the kernel as its argument (LaunchInlineChunkHash).
inline constexpr int kInlineChunkHashSegments = 8;

// LaunchSegmentedChunkHash of `count` (1..kInlineChunkHashSegments) segments in host memory,
// passed as the kernel's argument: no table copied to the device first, one launch. The operator
// recorder hashes a call's tensors this way (Note [Digest arena] in digest_arena.h).
cudaError_t LaunchInlineChunkHash(const ChunkHashSegment* segments, int count,
                                  uint64_t total_chunks, uint8_t* out, cudaStream_t stream);

// LaunchInlineChunkHash of chunks [chunk_begin, chunk_end) only.
cudaError_t LaunchInlineChunkHashRange(const ChunkHashSegment* segments, int count,
                                       uint64_t chunk_begin, uint64_t chunk_end, uint8_t* out,
                                       cudaStream_t stream);

// The chunks of one buffer (device memory, 8-byte aligned), into out[16 * j ..) (device memory):
// LaunchInlineChunkHash of a single segment.
cudaError_t LaunchChunkHash(const uint8_t* data, uint64_t num_bytes, uint8_t* out,
                            cudaStream_t stream);

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_INTERNAL_CHUNK_HASH_KERNEL_H_
