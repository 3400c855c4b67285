#include "numerics/internal/chunk_hash_kernel.h"

#include <atomic>

#include "numerics/internal/xxh3_chunk.h"

namespace lockstep {
namespace numerics {
namespace internal {
namespace {

__constant__ uint8_t kSecret[kXxh3SecretBytes] = {LOCKSTEP_XXH3_SECRET_BYTES};

// Note [Digest chunks through shared memory]: XXH3 walks a chunk's 64-byte stripes in order, so
// each of a chunk's eight lanes reads 8 bytes at a 64-byte stride, and a warp's load touches four
// chunks 16 KiB apart; loaded that way straight from global memory the kernel kept too few bytes
// in flight to stream at the memory's speed. So a block of 32 chunks moves each 1 KiB stage of its
// chunks (16 stripes: one XXH3 block) into shared memory with asynchronous 16-byte copies, whole
// contiguous kilobytes per pair of warps, kStages - 1 stages ahead of the stage being hashed, and
// the lanes hash from shared memory. The copies zero-fill past a tensor's last byte (DIGEST.md's
// padding) and take 8-byte pieces where a tensor is only 8-byte aligned.
constexpr int kChunksPerBlock = 32;
constexpr int kThreads = 8 * kChunksPerBlock;
constexpr int kStageBytesPerChunk = 64 * kXxh3StripesPerBlock;  // 1 KiB
constexpr int kStagesPerChunk = kXxh3ChunkBytes / kStageBytesPerChunk;
constexpr int kStageBytes = kChunksPerBlock * kStageBytesPerChunk;
constexpr int kStages = 3;
constexpr int kSharedBytes = kStages * kStageBytes;
constexpr int kSecretWords = kXxh3SecretBytes / 8;
static_assert(kStagesPerChunk == kXxh3Blocks + 1, "15 blocks, then the tail and the last stripe");
static_assert(kXxh3TailStripes == kXxh3StripesPerBlock - 1, "the tail fills the last stage");
static_assert(kStageBytes % (16 * kThreads) == 0, "a stage is whole 16-byte pieces per thread");

__device__ __forceinline__ void CopyAsync16(void* shared, const void* global, int bytes) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(global),
               "r"(bytes));
}
__device__ __forceinline__ void CopyAsync8(void* shared, const void* global, int bytes) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(to), "l"(global), "r"(bytes));
}
__device__ __forceinline__ void CommitCopies() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void WaitCopies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// What the block knows of each of its chunks.
struct ChunkInfo {
  const uint8_t* data;  // the chunk's first byte (null for a chunk past the batch's end)
  int available;        // its bytes that exist, 0..16384; zeros past them
  bool aligned16;
};

// Starts the copies of stage `stage` of every chunk of the block into `to`.
__device__ __forceinline__ void LoadStage(const ChunkInfo* chunks, int stage, uint8_t* to) {
#pragma unroll
  for (int i = 0; i < kStageBytes / (16 * kThreads); ++i) {
    const int piece = i * kThreads + threadIdx.x;  // 64 consecutive pieces per chunk
    const int c = piece / (kStageBytesPerChunk / 16);
    const int offset = stage * kStageBytesPerChunk + 16 * (piece % (kStageBytesPerChunk / 16));
    uint8_t* shared = to + 16 * piece;
    const ChunkInfo& chunk = chunks[c];
    const int left = chunk.available - offset;
    if (left <= 0) {
      *reinterpret_cast<uint4*>(shared) = make_uint4(0, 0, 0, 0);
    } else if (chunk.aligned16) {
      CopyAsync16(shared, chunk.data + offset, left < 16 ? left : 16);
    } else {
      CopyAsync8(shared, chunk.data + offset, left < 8 ? left : 8);
      if (left > 8) {
        CopyAsync8(shared + 8, chunk.data + offset + 8, left < 16 ? left - 8 : 8);
      } else {
        *reinterpret_cast<uint2*>(shared + 8) = make_uint2(0, 0);
      }
    }
  }
}

// Adds stripe `s` of a stage (at `stage`, this chunk's 1 KiB) to lane `lane`'s accumulator: its
// own word times the key, plus the word of lane ^ 1 (both read as one 16-byte pair).
__device__ __forceinline__ uint64_t Stripe(const uint8_t* stage, int offset, int lane, uint64_t key,
                                           uint64_t acc) {
  const uint4 pair = *reinterpret_cast<const uint4*>(stage + offset + 16 * (lane >> 1));
  const uint64_t even = (static_cast<uint64_t>(pair.y) << 32) | pair.x;
  const uint64_t odd = (static_cast<uint64_t>(pair.w) << 32) | pair.z;
  const uint64_t mine = (lane & 1) ? odd : even;
  const uint64_t other = (lane & 1) ? even : odd;
  return acc + Xxh3LaneProduct(mine, key) + other;
}

// A few segments, passed by value (LaunchInlineChunkHash).
struct InlineSegments {
  ChunkHashSegment at[kInlineChunkHashSegments];
};

// Thread 8c + l hashes lane l of the block's chunk c (Note [Digest chunks through shared memory]);
// the launch's blocks cover chunks [chunk_begin, chunk_end), and a chunk belongs to the last
// segment whose first chunk is at most its index. The segments are `segments` (device memory) or,
// when it is null, `inline_segments`.
__global__ void __launch_bounds__(kThreads)
    SegmentedChunkHashKernel(const ChunkHashSegment* __restrict__ segments,
                             InlineSegments inline_segments, int count, uint64_t chunk_begin,
                             uint64_t chunk_end, uint8_t* __restrict__ out) {
  extern __shared__ __align__(16) uint8_t stages[];
  __shared__ uint64_t secret[kSecretWords];
  __shared__ ChunkInfo chunks[kChunksPerBlock];
  const uint64_t first = chunk_begin + static_cast<uint64_t>(blockIdx.x) * kChunksPerBlock;
  if (threadIdx.x < kSecretWords) secret[threadIdx.x] = Xxh3ReadLe64(kSecret + 8 * threadIdx.x);
  if (threadIdx.x < kChunksPerBlock) {
    const uint64_t chunk = first + threadIdx.x;
    ChunkInfo info{nullptr, 0, false};
    if (chunk < chunk_end) {
      const ChunkHashSegment* table = segments == nullptr ? inline_segments.at : segments;
      int lo = 0, hi = count - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (table[mid].first_chunk <= chunk) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      const ChunkHashSegment segment = table[lo];
      const uint64_t local = chunk - segment.first_chunk;
      const uint64_t left = segment.num_bytes - local * kXxh3ChunkBytes;
      info.data = segment.data + local * kXxh3ChunkBytes;
      info.available = left < kXxh3ChunkBytes ? static_cast<int>(left) : kXxh3ChunkBytes;
      info.aligned16 = reinterpret_cast<uintptr_t>(info.data) % 16 == 0;
    }
    chunks[threadIdx.x] = info;
  }
  __syncthreads();

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    LoadStage(chunks, s, stages + s * kStageBytes);
    CommitCopies();
  }

  const int lane = threadIdx.x & 7;
  const int c = threadIdx.x / 8;
  uint64_t keys[kXxh3StripesPerBlock];
#pragma unroll
  for (int s = 0; s < kXxh3StripesPerBlock; ++s) keys[s] = secret[s + lane];
  const uint64_t scramble_key = secret[kXxh3ScrambleSecret / 8 + lane];
  // The last stripe's key starts at byte 121 = word 15's second byte: the high seven bytes of
  // word 15 + lane and the low byte of word 16 + lane.
  static_assert(kXxh3LastStripeSecret == 8 * 15 + 1, "the last stripe's key straddles two words");
  const uint64_t last_key = (secret[15 + lane] >> 8) | (secret[16 + lane] << 56);
  uint64_t acc = Xxh3InitialLane(lane);

  for (int n = 0; n < kStagesPerChunk; ++n) {
    WaitCopies<kStages - 2>();  // this thread's copies of stage n have landed
    __syncthreads();            // everyone's have, and everyone is done with stage n - 1's buffer
    if (n + kStages - 1 < kStagesPerChunk) {
      LoadStage(chunks, n + kStages - 1, stages + ((n + kStages - 1) % kStages) * kStageBytes);
    }
    CommitCopies();  // an empty group near the end keeps the count WaitCopies relies on
    const uint8_t* stage = stages + (n % kStages) * kStageBytes + c * kStageBytesPerChunk;
    if (n < kXxh3Blocks) {
#pragma unroll
      for (int s = 0; s < kXxh3StripesPerBlock; ++s)
        acc = Stripe(stage, 64 * s, lane, keys[s], acc);
      acc = Xxh3Scramble(acc, scramble_key);
    } else {
#pragma unroll
      for (int s = 0; s < kXxh3TailStripes; ++s) acc = Stripe(stage, 64 * s, lane, keys[s], acc);
      acc = Stripe(stage, kStageBytesPerChunk - 64, lane, last_key, acc);
    }
  }

  const unsigned group = 0xFFu << (threadIdx.x & 24);
  uint64_t lanes[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) lanes[i] = __shfl_sync(group, acc, i, 8);
  if (lane == 0 && first + c < chunk_end) Xxh3Finish(lanes, kSecret, out + 16 * (first + c));
}

// Above the default 48 KiB of dynamic shared memory: set once per device, the first time a
// launch runs there (the attribute is the device's, and a host call per launch adds up when the
// operator recorder launches inside every operator call).
cudaError_t AllowSharedMemory() {
  static std::atomic<uint64_t> allowed{0};  // bit d: device d has the attribute
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return error;
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (allowed.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  error = cudaFuncSetAttribute(SegmentedChunkHashKernel,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
  if (error == cudaSuccess) allowed.fetch_or(bit, std::memory_order_acq_rel);
  return error;
}

cudaError_t Launch(const ChunkHashSegment* segments, const InlineSegments& inline_segments,
                   int count, uint64_t chunk_begin, uint64_t chunk_end, uint8_t* out,
                   cudaStream_t stream) {
  if (count == 0 || chunk_end <= chunk_begin) return cudaSuccess;
  const cudaError_t error = AllowSharedMemory();
  if (error != cudaSuccess) return error;
  const uint64_t blocks = (chunk_end - chunk_begin + kChunksPerBlock - 1) / kChunksPerBlock;
  SegmentedChunkHashKernel<<<static_cast<unsigned>(blocks), kThreads, kSharedBytes, stream>>>(
      segments, inline_segments, count, chunk_begin, chunk_end, out);
  return cudaGetLastError();
}

InlineSegments InlineOf(const ChunkHashSegment* segments, int count) {
  InlineSegments inline_segments{};
  for (int i = 0; i < count; ++i) inline_segments.at[i] = segments[i];
  return inline_segments;
}

}  // namespace

cudaError_t LaunchSegmentedChunkHash(const ChunkHashSegment* segments, int count,
                                     uint64_t total_chunks, uint8_t* out, cudaStream_t stream) {
  return Launch(segments, InlineSegments{}, count, 0, total_chunks, out, stream);
}

cudaError_t LaunchSegmentedChunkHashRange(const ChunkHashSegment* segments, int count,
                                          uint64_t chunk_begin, uint64_t chunk_end, uint8_t* out,
                                          cudaStream_t stream) {
  return Launch(segments, InlineSegments{}, count, chunk_begin, chunk_end, out, stream);
}

cudaError_t LaunchInlineChunkHash(const ChunkHashSegment* segments, int count,
                                  uint64_t total_chunks, uint8_t* out, cudaStream_t stream) {
  return LaunchInlineChunkHashRange(segments, count, 0, total_chunks, out, stream);
}

cudaError_t LaunchInlineChunkHashRange(const ChunkHashSegment* segments, int count,
                                       uint64_t chunk_begin, uint64_t chunk_end, uint8_t* out,
                                       cudaStream_t stream) {
  if (count < 0 || count > kInlineChunkHashSegments) return cudaErrorInvalidValue;
  return Launch(nullptr, InlineOf(segments, count), count, chunk_begin, chunk_end, out, stream);
}

cudaError_t LaunchChunkHash(const uint8_t* data, uint64_t num_bytes, uint8_t* out,
                            cudaStream_t stream) {
  const ChunkHashSegment segment{data, num_bytes, 0};
  return LaunchInlineChunkHash(&segment, 1, (num_bytes + kXxh3ChunkBytes - 1) / kXxh3ChunkBytes,
                               out, stream);
}

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
