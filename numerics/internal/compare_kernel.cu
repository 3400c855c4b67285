#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "numerics/internal/compare_kernel.h"
#include "numerics/internal/element_value.cuh"

namespace lockstep {
namespace numerics {
namespace internal {
namespace {

constexpr int kThreads = 256;

template <typename T>
struct BitsOf;
template <>
struct BitsOf<double> {
  using type = unsigned long long;
};
template <>
struct BitsOf<int64_t> {
  using type = unsigned long long;
};
template <>
struct BitsOf<float> {
  using type = unsigned int;
};
template <>
struct BitsOf<int32_t> {
  using type = unsigned int;
};
template <>
struct BitsOf<__half> {
  using type = unsigned short;
};
template <>
struct BitsOf<__nv_bfloat16> {
  using type = unsigned short;
};
template <>
struct BitsOf<int16_t> {
  using type = unsigned short;
};
template <>
struct BitsOf<int8_t> {
  using type = unsigned char;
};
template <>
struct BitsOf<uint8_t> {
  using type = unsigned char;
};
template <>
struct BitsOf<bool> {
  using type = unsigned char;
};

__device__ __forceinline__ ComparePartial Shuffle(const ComparePartial& p, int offset) {
  ComparePartial q;
  q.over = __shfl_down_sync(0xffffffffu, p.over, offset);
  q.bit_differs = __shfl_down_sync(0xffffffffu, p.bit_differs, offset);
  q.first_over = __shfl_down_sync(0xffffffffu, p.first_over, offset);
  q.first_bit_diff = __shfl_down_sync(0xffffffffu, p.first_bit_diff, offset);
  q.nonfinite = __shfl_down_sync(0xffffffffu, p.nonfinite, offset);
  q.max_diff = __shfl_down_sync(0xffffffffu, p.max_diff, offset);
  q.max_ratio = __shfl_down_sync(0xffffffffu, p.max_ratio, offset);
  q.sum_diff2 = __shfl_down_sync(0xffffffffu, p.sum_diff2, offset);
  q.sum_b2 = __shfl_down_sync(0xffffffffu, p.sum_b2, offset);
  return q;
}

template <typename T>
__device__ __forceinline__ void Visit(const T* a, const T* b, int64_t i,
                                      const CompareParams& params, ComparePartial& p) {
  using Bits = typename BitsOf<T>::type;
  const T av = a[i];
  const T bv = b[i];
  Bits abits, bbits;
  memcpy(&abits, &av, sizeof(T));
  memcpy(&bbits, &bv, sizeof(T));
  VisitElement(ToDouble(av), ToDouble(bv), abits == bbits, i, params, p);
}

// The elements of one 16-byte vector of each input, the vector's first element being `first`.
template <typename T>
__device__ __forceinline__ void VisitVector(const uint4& av, const uint4& bv, int64_t first,
                                            const CompareParams& params, ComparePartial& p) {
  using Bits = typename BitsOf<T>::type;
  constexpr int kPer = sizeof(uint4) / sizeof(T);
  T as[kPer], bs[kPer];
  memcpy(as, &av, sizeof(uint4));
  memcpy(bs, &bv, sizeof(uint4));
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    Bits abits, bbits;
    memcpy(&abits, &as[k], sizeof(T));
    memcpy(&bbits, &bs[k], sizeof(T));
    VisitElement(ToDouble(as[k]), ToDouble(bs[k]), abits == bbits, first + k, params, p);
  }
}

// A grid-stride pass; each thread visits its indices in increasing order, so its first failing
// index is its smallest; blocks reduce through warp shuffles and shared memory. Where both inputs
// are 16-byte aligned the pass reads 16-byte vectors, two per input in flight per thread (one
// element per load cannot keep enough bytes in flight to reach the memory's bandwidth), then the
// elements past the last whole vector one by one.
template <typename T>
__global__ void CompareKernel(const T* __restrict__ a, const T* __restrict__ b, int64_t n,
                              CompareParams params, ComparePartial* __restrict__ partials) {
  constexpr int kPer = sizeof(uint4) / sizeof(T);
  ComparePartial p;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t thread = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) % sizeof(uint4)) == 0;
  const int64_t vectors = aligned ? n / kPer : 0;
  const uint4* av = reinterpret_cast<const uint4*>(a);
  const uint4* bv = reinterpret_cast<const uint4*>(b);
  for (int64_t v = thread; v < vectors; v += 2 * stride) {
    const bool second = v + stride < vectors;
    const uint4 a0 = __ldg(av + v), b0 = __ldg(bv + v);
    uint4 a1 = a0, b1 = b0;
    if (second) {
      a1 = __ldg(av + v + stride);
      b1 = __ldg(bv + v + stride);
    }
    VisitVector<T>(a0, b0, v * kPer, params, p);
    if (second) VisitVector<T>(a1, b1, (v + stride) * kPer, params, p);
  }
  for (int64_t i = vectors * kPer + thread; i < n; i += stride) Visit(a, b, i, params, p);
  for (int offset = 16; offset > 0; offset /= 2) MergePartial(p, Shuffle(p, offset));
  __shared__ ComparePartial warps[kThreads / 32];
  const int warp = threadIdx.x / 32;
  if ((threadIdx.x & 31) == 0) warps[warp] = p;
  __syncthreads();
  if (threadIdx.x == 0) {
    ComparePartial block = warps[0];
    for (int w = 1; w < kThreads / 32; ++w) MergePartial(block, warps[w]);
    partials[blockIdx.x] = block;
  }
}

template <typename T>
cudaError_t Launch(const void* a, const void* b, int64_t n, double atol, double rtol,
                   bool nan_equal, ComparePartial* partials, cudaStream_t stream) {
  CompareKernel<T><<<kComparePartials, kThreads, 0, stream>>>(
      static_cast<const T*>(a), static_cast<const T*>(b), n, CompareParams{atol, rtol, nan_equal},
      partials);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchCompare(const void* a, const void* b, int64_t n, ElementType type, double atol,
                          double rtol, bool nan_equal, ComparePartial* partials,
                          cudaStream_t stream) {
  switch (type) {
    case ElementType::kDouble:
      return Launch<double>(a, b, n, atol, rtol, nan_equal, partials, stream);
    case ElementType::kFloat:
      return Launch<float>(a, b, n, atol, rtol, nan_equal, partials, stream);
    case ElementType::kHalf:
      return Launch<__half>(a, b, n, atol, rtol, nan_equal, partials, stream);
    case ElementType::kBFloat16:
      return Launch<__nv_bfloat16>(a, b, n, atol, rtol, nan_equal, partials, stream);
    case ElementType::kInt64:
      return Launch<int64_t>(a, b, n, atol, rtol, nan_equal, partials, stream);
    case ElementType::kInt32:
      return Launch<int32_t>(a, b, n, atol, rtol, nan_equal, partials, stream);
    case ElementType::kInt16:
      return Launch<int16_t>(a, b, n, atol, rtol, nan_equal, partials, stream);
    case ElementType::kInt8:
      return Launch<int8_t>(a, b, n, atol, rtol, nan_equal, partials, stream);
    case ElementType::kUInt8:
      return Launch<uint8_t>(a, b, n, atol, rtol, nan_equal, partials, stream);
    case ElementType::kBool:
      return Launch<bool>(a, b, n, atol, rtol, nan_equal, partials, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
