#include "numerics/internal/chunk_hash_kernel.h"

#include "numerics/internal/xxh3_chunk.h"

namespace lockstep {
namespace numerics {
namespace internal {
namespace {

__constant__ uint8_t kSecret[kXxh3SecretBytes] = {LOCKSTEP_XXH3_SECRET_BYTES};

constexpr int kThreadsPerBlock = 256;  // 64 chunks per block

// Word `offset` (bytes, multiple of 8) of a chunk: a plain load when the chunk is whole, else
// the bytes that exist and zeros past them.
__device__ __forceinline__ uint64_t Load(const uint8_t* chunk, int offset, uint64_t available) {
  if (offset + 8 <= available)
    return __ldg(reinterpret_cast<const unsigned long long*>(chunk + offset));
  uint64_t v = 0;
  for (int b = 7; b >= 0; --b) {
    v = (v << 8) | (offset + b < available ? chunk[offset + b] : 0);
  }
  return v;
}

// Words `offset` and `offset` + 8 (offset a multiple of 16; chunks are 16-byte aligned): one
// 16-byte load when both exist.
__device__ __forceinline__ void Load2(const uint8_t* chunk, int offset, uint64_t available,
                                      uint64_t& w0, uint64_t& w1) {
  if (offset + 16 <= available) {
    const ulonglong2 v = __ldg(reinterpret_cast<const ulonglong2*>(chunk + offset));
    w0 = v.x;
    w1 = v.y;
    return;
  }
  w0 = Load(chunk, offset, available);
  w1 = Load(chunk, offset + 8, available);
}

// Note [Two lanes per thread]: XXH3's stripe adds to lane i the product of its own input word
// and to lane i ^ 1 the word itself, so lanes 2q and 2q + 1 need exactly input words 2q and
// 2q + 1 of each stripe: one thread keeps both (one 16-byte load per stripe, no exchange between
// threads), four threads hash a chunk, and thread 0 of the four gathers the eight lanes to merge
// them. Accumulation order per lane is XXH3's, so the hash is the same.
//
// Thread `q` (0..3) of the four hashing the chunk at `input` (`available` bytes of it exist;
// zeros past them) into out[0..16); `group` is the four threads' shuffle mask.
__device__ __forceinline__ void HashChunk(const uint8_t* input, uint64_t available, int q,
                                          unsigned group, uint8_t* out) {
  const int a = 2 * q, b = 2 * q + 1;
  uint64_t keys_a[kXxh3StripesPerBlock], keys_b[kXxh3StripesPerBlock];
#pragma unroll
  for (int s = 0; s < kXxh3StripesPerBlock; ++s) {
    keys_a[s] = Xxh3ReadLe64(kSecret + 8 * (s + a));
    keys_b[s] = Xxh3ReadLe64(kSecret + 8 * (s + b));
  }
  const uint64_t scramble_a = Xxh3ReadLe64(kSecret + kXxh3ScrambleSecret + 8 * a);
  const uint64_t scramble_b = Xxh3ReadLe64(kSecret + kXxh3ScrambleSecret + 8 * b);
  uint64_t acc_a = Xxh3InitialLane(a), acc_b = Xxh3InitialLane(b);
  auto stripe = [&](uint64_t key_a, uint64_t key_b, uint64_t wa, uint64_t wb) {
    acc_a += Xxh3LaneProduct(wa, key_a) + wb;
    acc_b += Xxh3LaneProduct(wb, key_b) + wa;
  };

  constexpr int kBlockBytes = 64 * kXxh3StripesPerBlock;
  constexpr int kHalf = kXxh3StripesPerBlock / 2;  // stripes loaded before they are used
  for (int n = 0; n < kXxh3Blocks; ++n) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint64_t wa[kHalf], wb[kHalf];
#pragma unroll
      for (int s = 0; s < kHalf; ++s) {
        Load2(input, n * kBlockBytes + 64 * (h * kHalf + s) + 16 * q, available, wa[s], wb[s]);
      }
#pragma unroll
      for (int s = 0; s < kHalf; ++s) {
        stripe(keys_a[h * kHalf + s], keys_b[h * kHalf + s], wa[s], wb[s]);
      }
    }
    acc_a = Xxh3Scramble(acc_a, scramble_a);
    acc_b = Xxh3Scramble(acc_b, scramble_b);
  }
  {
    uint64_t wa[kXxh3TailStripes], wb[kXxh3TailStripes];
#pragma unroll
    for (int s = 0; s < kXxh3TailStripes; ++s) {
      Load2(input, kXxh3Blocks * kBlockBytes + 64 * s + 16 * q, available, wa[s], wb[s]);
    }
#pragma unroll
    for (int s = 0; s < kXxh3TailStripes; ++s) stripe(keys_a[s], keys_b[s], wa[s], wb[s]);
  }
  uint64_t la, lb;
  Load2(input, kXxh3ChunkBytes - 64 + 16 * q, available, la, lb);
  stripe(Xxh3ReadLe64(kSecret + kXxh3LastStripeSecret + 8 * a),
         Xxh3ReadLe64(kSecret + kXxh3LastStripeSecret + 8 * b), la, lb);

  uint64_t lanes[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    lanes[2 * i] = __shfl_sync(group, acc_a, i, 4);
    lanes[2 * i + 1] = __shfl_sync(group, acc_b, i, 4);
  }
  if (q == 0) Xxh3Finish(lanes, kSecret, out);
}

// Thread 4g + q hashes lanes 2q and 2q + 1 of the batch's chunk g, which belongs to the last
// segment whose first chunk is at most g (a binary search over the segments, the same for the
// four threads).
__global__ void SegmentedChunkHashKernel(const ChunkHashSegment* __restrict__ segments, int count,
                                         uint64_t total_chunks, uint8_t* __restrict__ out) {
  const uint64_t thread = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  const uint64_t chunk = thread / 4;
  if (chunk >= total_chunks) return;  // whole groups of 4 leave together
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (segments[mid].first_chunk <= chunk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const ChunkHashSegment segment = segments[lo];
  const uint64_t local = chunk - segment.first_chunk;
  const uint64_t left = segment.num_bytes - local * kXxh3ChunkBytes;
  HashChunk(segment.data + local * kXxh3ChunkBytes, left < kXxh3ChunkBytes ? left : kXxh3ChunkBytes,
            threadIdx.x & 3, 0xFu << (threadIdx.x & 28), out + 16 * chunk);
}

}  // namespace

cudaError_t LaunchSegmentedChunkHash(const ChunkHashSegment* segments, int count,
                                     uint64_t total_chunks, uint8_t* out, cudaStream_t stream) {
  if (count == 0 || total_chunks == 0) return cudaSuccess;
  const uint64_t threads = 4 * total_chunks;
  const uint64_t blocks = (threads + kThreadsPerBlock - 1) / kThreadsPerBlock;
  SegmentedChunkHashKernel<<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
      segments, count, total_chunks, out);
  return cudaGetLastError();
}

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
