#include "numerics/internal/summary_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "numerics/internal/element_value.cuh"

namespace lockstep {
namespace numerics {
namespace internal {
namespace {

constexpr int kThreads = 256;
// Loads in flight per thread (the loop's unrolled reads): with kMaxBlocks blocks, enough bytes in
// flight to stream a large tensor at the memory's speed.
constexpr int kUnroll = 8;
constexpr int kMaxBlocks = 1024;

// max with NaN winning (Note [Summary partials]).
__device__ __forceinline__ double MaxNan(double a, double b) {
  return a != a ? a : (b != b ? b : (a > b ? a : b));
}

// Block b's threads read elements b * kThreads * kUnroll + ... in a grid-stride loop (coalesced:
// consecutive threads, consecutive elements), each adding its own in a fixed order; the block
// then adds its threads' sums as a fixed tree.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    SummaryKernel(const T* __restrict__ data, uint64_t count, double* __restrict__ partials) {
  double sum = 0;
  double max_abs = 0;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * kThreads * kUnroll;
  for (uint64_t base = static_cast<uint64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x;
       base < count; base += stride) {
    double x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint64_t i = base + static_cast<uint64_t>(u) * kThreads;
      x[u] = i < count ? ToDouble(data[i]) : 0.0;  // past the end: adds 0, never raises the max
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      sum += x[u];
      max_abs = MaxNan(max_abs, fabs(x[u]));
    }
  }
  __shared__ double sums[kThreads];
  __shared__ double maxes[kThreads];
  sums[threadIdx.x] = sum;
  maxes[threadIdx.x] = max_abs;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) {
      sums[threadIdx.x] += sums[threadIdx.x + half];
      maxes[threadIdx.x] = MaxNan(maxes[threadIdx.x], maxes[threadIdx.x + half]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = sums[0];
    partials[2 * blockIdx.x + 1] = maxes[0];
  }
}

template <typename T>
cudaError_t Launch(const void* data, uint64_t count, double* partials, cudaStream_t stream) {
  SummaryKernel<T><<<SummaryPartials(count), kThreads, 0, stream>>>(static_cast<const T*>(data),
                                                                    count, partials);
  return cudaGetLastError();
}

}  // namespace

int SummaryPartials(uint64_t count) {
  const uint64_t per_block = static_cast<uint64_t>(kThreads) * kUnroll;
  const uint64_t blocks = (count + per_block - 1) / per_block;
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

cudaError_t LaunchSummary(const void* data, uint64_t count, ElementType type, double* partials,
                          cudaStream_t stream) {
  if (count == 0) return cudaErrorInvalidValue;
  switch (type) {
    case ElementType::kDouble:
      return Launch<double>(data, count, partials, stream);
    case ElementType::kFloat:
      return Launch<float>(data, count, partials, stream);
    case ElementType::kHalf:
      return Launch<__half>(data, count, partials, stream);
    case ElementType::kBFloat16:
      return Launch<__nv_bfloat16>(data, count, partials, stream);
    case ElementType::kInt64:
      return Launch<int64_t>(data, count, partials, stream);
    case ElementType::kInt32:
      return Launch<int32_t>(data, count, partials, stream);
    case ElementType::kInt16:
      return Launch<int16_t>(data, count, partials, stream);
    case ElementType::kInt8:
      return Launch<int8_t>(data, count, partials, stream);
    case ElementType::kUInt8:
      return Launch<uint8_t>(data, count, partials, stream);
    case ElementType::kBool:
      return Launch<bool>(data, count, partials, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
