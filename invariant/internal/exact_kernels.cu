#include "invariant/internal/exact_kernels.h"

namespace lockstep {
namespace invariant {
namespace internal {
namespace {

using u128 = unsigned __int128;
using i128 = __int128;

constexpr int kTile = 32;          // an outer-product block's rows and columns of the sums
constexpr int kRowsPerThread = 4;  // rows of the block per thread (blockDim.y = kTile / 4)
constexpr int kTokenTile = 32;     // tokens staged in shared memory at a time
constexpr int64_t kTargetBlocks = 1024;

// round(mantissa * 2^shift), ties to even, as a two's complement 128-bit integer: the integer
// rounding of exact_gradients.cc's FixedProduct (Note [Products as integers]). Precondition:
// the result fits (the caller's range checks).
__device__ __forceinline__ u128 Rounded(long long mantissa, int shift) {
  if (mantissa == 0) return 0;
  if (shift >= 0) return static_cast<u128>(static_cast<i128>(mantissa)) << shift;
  const int right = -shift;
  if (right >= 64) return 0;               // |mantissa| < 2^63: below half of 2^right
  long long quotient = mantissa >> right;  // floor
  const unsigned long long remainder =
      static_cast<unsigned long long>(mantissa) & ((1ull << right) - 1);
  const unsigned long long half = 1ull << (right - 1);
  if (remainder > half || (remainder == half && (quotient & 1))) ++quotient;
  return static_cast<u128>(static_cast<i128>(quotient));
}

// A finite float32 as (mantissa, exponent): value = mantissa * 2^exponent, |mantissa| < 2^24.
__device__ __forceinline__ int2 SplitFloat(float value) {
  const unsigned bits = __float_as_uint(value);
  const int field = static_cast<int>((bits >> 23) & 0xFF);
  const int fraction = static_cast<int>(bits & 0x7FFFFF);
  const int magnitude = field == 0 ? fraction : (fraction | 0x800000);
  return make_int2((bits >> 31) ? -magnitude : magnitude, field == 0 ? -149 : field - 150);
}

// A finite float64 rounded to a multiple of 2^-fraction_bits.
__device__ __forceinline__ u128 FixedDouble(double value, int fraction_bits) {
  const unsigned long long bits = static_cast<unsigned long long>(__double_as_longlong(value));
  const int field = static_cast<int>((bits >> 52) & 0x7FF);
  const unsigned long long fraction = bits & ((1ull << 52) - 1);
  const long long magnitude =
      static_cast<long long>(field == 0 ? fraction : (fraction | (1ull << 52)));
  const int exponent = field == 0 ? -1074 : field - 1075;
  return Rounded((bits >> 63) ? -magnitude : magnitude, exponent + fraction_bits);
}

// word[0..1] += value (mod 2^128), in any order with other adds: the low word's carry is read
// from the value it replaced.
__device__ __forceinline__ void AtomicAdd128(unsigned long long* word, u128 value) {
  const unsigned long long low = static_cast<unsigned long long>(value);
  const unsigned long long high = static_cast<unsigned long long>(value >> 64);
  const unsigned long long old = atomicAdd(word, low);
  const unsigned long long carried = high + (old + low < old ? 1ull : 0ull);
  if (carried != 0) atomicAdd(word + 1, carried);
}

// Block (x, y, z): sums' rows [y * kTile, +kTile) and columns [x * kTile, +kTile), over tokens
// [z * tokens_per_block, +tokens_per_block). Thread (tx, ty): column tx, rows ty + 8 q.
__global__ void AddOuterProductsKernel(const float* __restrict__ a, const float* __restrict__ b,
                                       int64_t tokens, int64_t n, int64_t k,
                                       int64_t tokens_per_block, int fraction_bits,
                                       unsigned long long* sums) {
  __shared__ int2 sa[kTokenTile][kTile];  // [token][row]
  __shared__ int2 sb[kTokenTile][kTile];  // [token][column]
  constexpr int kStride = kTile / kRowsPerThread;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t column0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t begin = static_cast<int64_t>(blockIdx.z) * tokens_per_block;
  const int64_t end = begin + tokens_per_block < tokens ? begin + tokens_per_block : tokens;
  u128 acc[kRowsPerThread] = {};
  for (int64_t t0 = begin; t0 < end; t0 += kTokenTile) {
    for (int r = ty; r < kTokenTile; r += kStride) {
      const int64_t t = t0 + r;
      const bool live = t < end;
      sa[r][tx] = live && row0 + tx < n ? SplitFloat(a[t * n + row0 + tx]) : make_int2(0, 0);
      sb[r][tx] = live && column0 + tx < k ? SplitFloat(b[t * k + column0 + tx]) : make_int2(0, 0);
    }
    __syncthreads();
    const int count = end - t0 < kTokenTile ? static_cast<int>(end - t0) : kTokenTile;
    for (int r = 0; r < count; ++r) {
      const int2 y = sb[r][tx];
#pragma unroll
      for (int q = 0; q < kRowsPerThread; ++q) {
        const int2 x = sa[r][ty + kStride * q];
        acc[q] += Rounded(static_cast<long long>(x.x) * y.x, x.y + y.y + fraction_bits);
      }
    }
    __syncthreads();
  }
  const int64_t column = column0 + tx;
  if (column >= k) return;
#pragma unroll
  for (int q = 0; q < kRowsPerThread; ++q) {
    const int64_t row = row0 + ty + kStride * q;
    if (row < n && acc[q] != 0) AtomicAdd128(sums + 2 * (row * k + column), acc[q]);
  }
}

__global__ void AddRowsKernel(const int64_t* __restrict__ rows, const double* __restrict__ values,
                              int64_t count, int64_t k, int fraction_bits,
                              unsigned long long* sums) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const u128 fixed = FixedDouble(values[e], fraction_bits);
    if (fixed != 0) AtomicAdd128(sums + 2 * (rows[e / k] * k + e % k), fixed);
  }
}

// Thread: column x of the block's, over tokens [y * tokens_per_block, +tokens_per_block).
__global__ void AddColumnsKernel(const double* __restrict__ values, int64_t tokens, int64_t k,
                                 int64_t tokens_per_block, int fraction_bits,
                                 unsigned long long* sums) {
  const int64_t column = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= k) return;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * tokens_per_block;
  const int64_t end = begin + tokens_per_block < tokens ? begin + tokens_per_block : tokens;
  u128 acc = 0;
  for (int64_t t = begin; t < end; ++t) acc += FixedDouble(values[t * k + column], fraction_bits);
  if (acc != 0) AtomicAdd128(sums + 2 * column, acc);
}

__device__ __forceinline__ u128 Load128(const unsigned long long* word) {
  return static_cast<u128>(word[0]) | static_cast<u128>(word[1]) << 64;
}

__device__ __forceinline__ void Store128(unsigned long long* word, u128 value) {
  word[0] = static_cast<unsigned long long>(value);
  word[1] = static_cast<unsigned long long>(value >> 64);
}

__global__ void AddWordsKernel(const unsigned long long* __restrict__ addend, int64_t count,
                               unsigned long long* __restrict__ sums) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Store128(sums + 2 * e, Load128(sums + 2 * e) + Load128(addend + 2 * e));
  }
}

__global__ void ToLimbsKernel(const unsigned long long* __restrict__ sums, int64_t count,
                              int64_t* __restrict__ limbs) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const u128 v = Load128(sums + 2 * e);
    for (int l = 0; l < 4; ++l)
      limbs[4 * e + l] = static_cast<int64_t>((v >> (32 * l)) & 0xFFFFFFFFu);
  }
}

__global__ void FromLimbsKernel(const int64_t* __restrict__ limbs, int64_t count,
                                unsigned long long* __restrict__ sums) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    u128 v = 0;
    for (int l = 0; l < 4; ++l) {
      v += static_cast<u128>(static_cast<unsigned long long>(limbs[4 * e + l])) << (32 * l);
    }
    Store128(sums + 2 * e, v);
  }
}

__global__ void ToDoubleKernel(const unsigned long long* __restrict__ sums, int64_t count,
                               int fraction_bits, double* __restrict__ out) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const u128 v = Load128(sums + 2 * e);
    const bool negative = (v >> 127) != 0;
    const u128 magnitude = negative ? ~v + 1 : v;
    const unsigned long long high = static_cast<unsigned long long>(magnitude >> 64);
    const unsigned long long low = static_cast<unsigned long long>(magnitude);
    const int bits = high != 0 ? 128 - __clzll(high) : (low != 0 ? 64 - __clzll(low) : 0);
    u128 mantissa = magnitude;
    int shift = 0;
    if (bits > 53) {  // round to 53 bits, ties to even (a carry to 2^53 is still exact)
      shift = bits - 53;
      const u128 remainder = magnitude & ((static_cast<u128>(1) << shift) - 1);
      const u128 half = static_cast<u128>(1) << (shift - 1);
      mantissa = magnitude >> shift;
      if (remainder > half || (remainder == half && (mantissa & 1))) ++mantissa;
    }
    const double rounded = scalbn(static_cast<double>(static_cast<unsigned long long>(mantissa)),
                                  shift - fraction_bits);
    out[e] = negative ? -rounded : rounded;
  }
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

unsigned ElementBlocks(int64_t count) {
  const int64_t blocks = CeilDiv(count, 256);
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

}  // namespace

cudaError_t LaunchAddOuterProducts(const float* a, const float* b, int64_t tokens, int64_t n,
                                   int64_t k, int fraction_bits, unsigned long long* sums,
                                   cudaStream_t stream) {
  if (tokens == 0 || n == 0 || k == 0) return cudaSuccess;
  const int64_t columns = CeilDiv(k, kTile), rows = CeilDiv(n, kTile);
  if (rows > 65535) return cudaErrorInvalidValue;
  // Tokens split over blocks until the device has enough of them (the sums are integers: the
  // split does not change them).
  int64_t splits = CeilDiv(kTargetBlocks, columns * rows);
  const int64_t token_tiles = CeilDiv(tokens, kTokenTile);
  if (splits > token_tiles) splits = token_tiles;
  if (splits > 65535) splits = 65535;
  const int64_t per_block = CeilDiv(token_tiles, splits) * kTokenTile;
  const dim3 blocks(static_cast<unsigned>(columns), static_cast<unsigned>(rows),
                    static_cast<unsigned>(CeilDiv(tokens, per_block)));
  const dim3 threads(kTile, kTile / kRowsPerThread);
  AddOuterProductsKernel<<<blocks, threads, 0, stream>>>(a, b, tokens, n, k, per_block,
                                                         fraction_bits, sums);
  return cudaGetLastError();
}

cudaError_t LaunchAddRows(const int64_t* rows, const double* values, int64_t tokens, int64_t k,
                          int fraction_bits, unsigned long long* sums, cudaStream_t stream) {
  const int64_t count = tokens * k;
  if (count == 0) return cudaSuccess;
  int64_t blocks = CeilDiv(count, 256);
  if (blocks > 65536) blocks = 65536;
  AddRowsKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(rows, values, count, k,
                                                                   fraction_bits, sums);
  return cudaGetLastError();
}

cudaError_t LaunchAddColumns(const double* values, int64_t tokens, int64_t k, int fraction_bits,
                             unsigned long long* sums, cudaStream_t stream) {
  if (tokens == 0 || k == 0) return cudaSuccess;
  const int64_t columns = CeilDiv(k, 128);
  int64_t splits = CeilDiv(kTargetBlocks, columns);
  if (splits > CeilDiv(tokens, 16)) splits = CeilDiv(tokens, 16);
  if (splits > 65535) splits = 65535;
  const int64_t per_block = CeilDiv(tokens, splits);
  const dim3 blocks(static_cast<unsigned>(columns),
                    static_cast<unsigned>(CeilDiv(tokens, per_block)));
  AddColumnsKernel<<<blocks, 128, 0, stream>>>(values, tokens, k, per_block, fraction_bits, sums);
  return cudaGetLastError();
}

cudaError_t LaunchAddWords(const unsigned long long* addend, int64_t count,
                           unsigned long long* sums, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  AddWordsKernel<<<ElementBlocks(count), 256, 0, stream>>>(addend, count, sums);
  return cudaGetLastError();
}

cudaError_t LaunchToLimbs(const unsigned long long* sums, int64_t count, int64_t* limbs,
                          cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  ToLimbsKernel<<<ElementBlocks(count), 256, 0, stream>>>(sums, count, limbs);
  return cudaGetLastError();
}

cudaError_t LaunchFromLimbs(const int64_t* limbs, int64_t count, unsigned long long* sums,
                            cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  FromLimbsKernel<<<ElementBlocks(count), 256, 0, stream>>>(limbs, count, sums);
  return cudaGetLastError();
}

cudaError_t LaunchToDouble(const unsigned long long* sums, int64_t count, int fraction_bits,
                           double* out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  ToDoubleKernel<<<ElementBlocks(count), 256, 0, stream>>>(sums, count, fraction_bits, out);
  return cudaGetLastError();
}

}  // namespace internal
}  // namespace invariant
}  // namespace lockstep
