// numerics/internal/xxh3_chunk.h
//
// Private to numerics/: XXH3-128 (seed 0, default secret; xxHash 0.8's definition) of exactly
// one digest chunk of kXxh3ChunkBytes = 16384 bytes, the only input length the state digest
// hashes (DIGEST.md pads the last chunk). Written for the host and for CUDA device code alike,
// so that the device kernel (chunk_hash_kernel.cu) shares its constants and final merge with a
// serial host version that a CPU test checks against libxxhash.
//
// For this length XXH3 takes its long-input path: 8 accumulator lanes; 15 blocks of 16 stripes
// of 64 bytes, each stripe adding to lane i the product of the 32-bit halves of (input word i xor
// secret word s + i) and to lane i ^ 1 the input word, each block followed by a scramble of the
// lanes with the secret's last 64 bytes; then 15 more stripes, a last stripe at byte 16320 with
// the secret at byte 121; then two merges of the lanes into the low and high halves.

#ifndef LOCKSTEP_NUMERICS_INTERNAL_XXH3_CHUNK_H_
#define LOCKSTEP_NUMERICS_INTERNAL_XXH3_CHUNK_H_

#include <cstdint>

#ifdef __CUDACC__
#define LOCKSTEP_HOST_DEVICE __host__ __device__
#else
#define LOCKSTEP_HOST_DEVICE
#endif

// XXH3's default secret (192 bytes), as a list for array initializers on host and device.
#define LOCKSTEP_XXH3_SECRET_BYTES                                                                \
  0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, \
      0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67,   \
      0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff,   \
      0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81,   \
      0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b,   \
      0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef,   \
      0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc,   \
      0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8,   \
      0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3,   \
      0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda,   \
      0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47,   \
      0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f, 0x95,   \
      0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e

namespace lockstep {
namespace numerics {
namespace internal {

inline constexpr int kXxh3ChunkBytes = 16384;
inline constexpr int kXxh3SecretBytes = 192;
inline constexpr int kXxh3Blocks = 15;             // full blocks of 16 stripes before the tail
inline constexpr int kXxh3StripesPerBlock = 16;    // (192 - 64) / 8
inline constexpr int kXxh3TailStripes = 15;        // ((16384 - 1) - 15 * 1024) / 64
inline constexpr int kXxh3ScrambleSecret = 128;    // 192 - 64
inline constexpr int kXxh3LastStripeSecret = 121;  // 192 - 64 - 7
inline constexpr int kXxh3LowMergeSecret = 11;
inline constexpr int kXxh3HighMergeSecret = 117;  // 192 - 64 - 11

inline constexpr uint64_t kXxhPrime32_1 = 0x9E3779B1U;
inline constexpr uint64_t kXxhPrime32_2 = 0x85EBCA77U;
inline constexpr uint64_t kXxhPrime32_3 = 0xC2B2AE3DU;
inline constexpr uint64_t kXxhPrime64_1 = 0x9E3779B185EBCA87ULL;
inline constexpr uint64_t kXxhPrime64_2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr uint64_t kXxhPrime64_3 = 0x165667B19E3779F9ULL;
inline constexpr uint64_t kXxhPrime64_4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr uint64_t kXxhPrime64_5 = 0x27D4EB2F165667C5ULL;

// The initial value of accumulator lane i.
LOCKSTEP_HOST_DEVICE inline uint64_t Xxh3InitialLane(int i) {
  switch (i) {
    case 0:
      return kXxhPrime32_3;
    case 1:
      return kXxhPrime64_1;
    case 2:
      return kXxhPrime64_2;
    case 3:
      return kXxhPrime64_3;
    case 4:
      return kXxhPrime64_4;
    case 5:
      return kXxhPrime32_2;
    case 6:
      return kXxhPrime64_5;
    default:
      return kXxhPrime32_1;
  }
}

LOCKSTEP_HOST_DEVICE inline uint64_t Xxh3ReadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int b = 7; b >= 0; --b) v = (v << 8) | p[b];
  return v;
}

LOCKSTEP_HOST_DEVICE inline uint64_t Xxh3Mul128Fold64(uint64_t a, uint64_t b) {
#ifdef __CUDA_ARCH__
  return (a * b) ^ __umul64hi(a, b);
#else
  const unsigned __int128 product = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(product) ^ static_cast<uint64_t>(product >> 64);
#endif
}

// The product of the 32-bit halves of data ^ key (what a stripe adds to its own lane).
LOCKSTEP_HOST_DEVICE inline uint64_t Xxh3LaneProduct(uint64_t data, uint64_t key) {
  const uint64_t mixed = data ^ key;
  return (mixed & 0xFFFFFFFFULL) * (mixed >> 32);
}

LOCKSTEP_HOST_DEVICE inline uint64_t Xxh3Scramble(uint64_t lane, uint64_t key) {
  lane ^= lane >> 47;
  lane ^= key;
  return lane * kXxhPrime32_1;
}

LOCKSTEP_HOST_DEVICE inline uint64_t Xxh3Avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  h ^= h >> 32;
  return h;
}

// Merges the 8 lanes with the secret at `secret` (byte pointer), starting from `start`.
LOCKSTEP_HOST_DEVICE inline uint64_t Xxh3MergeLanes(const uint64_t* lanes, const uint8_t* secret,
                                                    uint64_t start) {
  uint64_t result = start;
  for (int i = 0; i < 4; ++i) {
    result += Xxh3Mul128Fold64(lanes[2 * i] ^ Xxh3ReadLe64(secret + 16 * i),
                               lanes[2 * i + 1] ^ Xxh3ReadLe64(secret + 16 * i + 8));
  }
  return Xxh3Avalanche(result);
}

// The 128-bit hash of the merged lanes of a 16384-byte input, in canonical byte order (high
// 64 bits big-endian, then low 64 bits big-endian) into out[0..16).
LOCKSTEP_HOST_DEVICE inline void Xxh3Finish(const uint64_t* lanes, const uint8_t* secret,
                                            uint8_t* out) {
  const uint64_t length = kXxh3ChunkBytes;
  const uint64_t low = Xxh3MergeLanes(lanes, secret + kXxh3LowMergeSecret, length * kXxhPrime64_1);
  const uint64_t high =
      Xxh3MergeLanes(lanes, secret + kXxh3HighMergeSecret, ~(length * kXxhPrime64_2));
  for (int b = 0; b < 8; ++b) {
    out[b] = static_cast<uint8_t>(high >> (56 - 8 * b));
    out[8 + b] = static_cast<uint8_t>(low >> (56 - 8 * b));
  }
}

// Adds one 64-byte stripe at `input` with the secret at `secret` to the lanes.
LOCKSTEP_HOST_DEVICE inline void Xxh3Stripe(uint64_t* lanes, const uint8_t* input,
                                            const uint8_t* secret) {
  for (int i = 0; i < 8; ++i) {
    const uint64_t data = Xxh3ReadLe64(input + 8 * i);
    lanes[i ^ 1] += data;
    lanes[i] += Xxh3LaneProduct(data, Xxh3ReadLe64(secret + 8 * i));
  }
}

// The serial reference: XXH3-128 of the 16384 bytes at `input` into out[0..16).
LOCKSTEP_HOST_DEVICE inline void Xxh3Chunk(const uint8_t* input, const uint8_t* secret,
                                           uint8_t* out) {
  uint64_t lanes[8];
  for (int i = 0; i < 8; ++i) lanes[i] = Xxh3InitialLane(i);
  constexpr int kBlockBytes = 64 * kXxh3StripesPerBlock;
  for (int n = 0; n < kXxh3Blocks; ++n) {
    for (int s = 0; s < kXxh3StripesPerBlock; ++s) {
      Xxh3Stripe(lanes, input + n * kBlockBytes + 64 * s, secret + 8 * s);
    }
    for (int i = 0; i < 8; ++i) {
      lanes[i] = Xxh3Scramble(lanes[i], Xxh3ReadLe64(secret + kXxh3ScrambleSecret + 8 * i));
    }
  }
  for (int s = 0; s < kXxh3TailStripes; ++s) {
    Xxh3Stripe(lanes, input + kXxh3Blocks * kBlockBytes + 64 * s, secret + 8 * s);
  }
  Xxh3Stripe(lanes, input + kXxh3ChunkBytes - 64, secret + kXxh3LastStripeSecret);
  Xxh3Finish(lanes, secret, out);
}

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_INTERNAL_XXH3_CHUNK_H_
