#include "numerics/internal/chunk_hash_kernel.h"

#include "numerics/internal/xxh3_chunk.h"

namespace lockstep {
namespace numerics {
namespace internal {
namespace {

__constant__ uint8_t kSecret[kXxh3SecretBytes] = {LOCKSTEP_XXH3_SECRET_BYTES};

constexpr int kThreadsPerBlock = 256;  // 32 chunks per block
constexpr int kSecretWords = kXxh3SecretBytes / 8;

// Word `offset` (bytes, multiple of 8) of a chunk: a plain load when the chunk is whole (known at
// compile time for every chunk but a tensor's last), else the bytes that exist and zeros past them.
template <bool kWhole>
__device__ __forceinline__ uint64_t Load(const uint8_t* chunk, int offset, uint64_t available) {
  if (kWhole || offset + 8 <= available)
    return __ldg(reinterpret_cast<const unsigned long long*>(chunk + offset));
  uint64_t v = 0;
  for (int b = 7; b >= 0; --b) {
    v = (v << 8) | (offset + b < available ? chunk[offset + b] : 0);
  }
  return v;
}

// Lane `lane` (0..7) of the group of eight threads hashing the chunk at `input` (`available`
// bytes of it exist; zeros past them) into out[0..16): lanes i and i ^ 1 swap their input words
// through a shuffle, and lane 0 gathers the lanes to merge them. `secret` is the secret as
// little-endian words in shared memory: the keys a lane needs sit at word offsets (s + lane), which
// differ across the lanes of a warp, and constant memory serializes such reads.
template <bool kWhole>
__device__ __forceinline__ void HashChunk(const uint8_t* input, uint64_t available, int lane,
                                          unsigned group, const uint64_t* secret, uint8_t* out) {
  uint64_t keys[kXxh3StripesPerBlock];
#pragma unroll
  for (int s = 0; s < kXxh3StripesPerBlock; ++s) keys[s] = secret[s + lane];
  const uint64_t scramble_key = secret[kXxh3ScrambleSecret / 8 + lane];
  // The last stripe's key starts at byte 121 = word 15's second byte: the high seven bytes of
  // word 15 + lane and the low byte of word 16 + lane.
  static_assert(kXxh3LastStripeSecret == 8 * 15 + 1, "the last stripe's key straddles two words");
  const uint64_t last_key = (secret[15 + lane] >> 8) | (secret[16 + lane] << 56);
  uint64_t acc = Xxh3InitialLane(lane);

  constexpr int kBlockBytes = 64 * kXxh3StripesPerBlock;
  for (int n = 0; n < kXxh3Blocks; ++n) {
    uint64_t words[kXxh3StripesPerBlock];
#pragma unroll
    for (int s = 0; s < kXxh3StripesPerBlock; ++s) {
      words[s] = Load<kWhole>(input, n * kBlockBytes + 64 * s + 8 * lane, available);
    }
#pragma unroll
    for (int s = 0; s < kXxh3StripesPerBlock; ++s) {
      acc += Xxh3LaneProduct(words[s], keys[s]);
      acc += __shfl_xor_sync(group, words[s], 1, 8);
    }
    acc = Xxh3Scramble(acc, scramble_key);
  }
  {
    uint64_t words[kXxh3TailStripes];
#pragma unroll
    for (int s = 0; s < kXxh3TailStripes; ++s) {
      words[s] = Load<kWhole>(input, kXxh3Blocks * kBlockBytes + 64 * s + 8 * lane, available);
    }
#pragma unroll
    for (int s = 0; s < kXxh3TailStripes; ++s) {
      acc += Xxh3LaneProduct(words[s], keys[s]);
      acc += __shfl_xor_sync(group, words[s], 1, 8);
    }
  }
  const uint64_t last = Load<kWhole>(input, kXxh3ChunkBytes - 64 + 8 * lane, available);
  acc += Xxh3LaneProduct(last, last_key);
  acc += __shfl_xor_sync(group, last, 1, 8);

  uint64_t lanes[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) lanes[i] = __shfl_sync(group, acc, i, 8);
  if (lane == 0) Xxh3Finish(lanes, kSecret, out);
}

// Thread 8g + l hashes lane l of the batch's chunk g, which belongs to the last segment whose
// first chunk is at most g (a binary search over the segments, the same for the eight lanes).
__global__ void SegmentedChunkHashKernel(const ChunkHashSegment* __restrict__ segments, int count,
                                         uint64_t total_chunks, uint8_t* __restrict__ out) {
  __shared__ uint64_t secret[kSecretWords];
  if (threadIdx.x < kSecretWords) secret[threadIdx.x] = Xxh3ReadLe64(kSecret + 8 * threadIdx.x);
  __syncthreads();
  const uint64_t thread = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  const uint64_t chunk = thread / 8;
  if (chunk >= total_chunks) return;  // whole groups of 8 leave together
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
  const uint8_t* input = segment.data + local * kXxh3ChunkBytes;
  const int lane = threadIdx.x & 7;
  const unsigned group = 0xFFu << (threadIdx.x & 24);
  if (left >= kXxh3ChunkBytes) {  // the same for the eight lanes: no divergence inside a group
    HashChunk<true>(input, kXxh3ChunkBytes, lane, group, secret, out + 16 * chunk);
  } else {
    HashChunk<false>(input, left, lane, group, secret, out + 16 * chunk);
  }
}

}  // namespace

cudaError_t LaunchSegmentedChunkHash(const ChunkHashSegment* segments, int count,
                                     uint64_t total_chunks, uint8_t* out, cudaStream_t stream) {
  if (count == 0 || total_chunks == 0) return cudaSuccess;
  const uint64_t threads = 8 * total_chunks;
  const uint64_t blocks = (threads + kThreadsPerBlock - 1) / kThreadsPerBlock;
  SegmentedChunkHashKernel<<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
      segments, count, total_chunks, out);
  return cudaGetLastError();
}

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
