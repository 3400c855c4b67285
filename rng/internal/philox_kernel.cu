// CUDA kernels of partition-invariant Philox randomness; see philox_kernel.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "rng/internal/philox_kernel.h"

namespace lockstep {
namespace rng {
namespace internal {
namespace {

// The four Philox4x32-10 words of block `block` under `key`.
__device__ __forceinline__ void PhiloxBlock(uint64_t block, const PhiloxKernelKey& key,
                                            uint32_t out[4]) {
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32);
  uint32_t c2 = key.step, c3 = key.stream;
  uint32_t k0 = static_cast<uint32_t>(key.seed), k1 = static_cast<uint32_t>(key.seed >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

__device__ __forceinline__ int64_t GlobalIndex(int64_t o, const PhiloxBox& box) {
  int64_t global = 0;
  for (int d = box.dims - 1; d >= 0; --d) {
    const int64_t extent = box.extent[d];
    global += (box.begin[d] + o % extent) * box.stride[d];
    o /= extent;
  }
  return global;
}

// Each thread handles kPerThread consecutive outputs: one index decomposition for all of them,
// and one Philox block per four global indices (two when the group straddles a block).
constexpr int kPerThread = 4;

template <typename Emit>
__device__ __forceinline__ void ForOutputs(int64_t total, const PhiloxBox& box,
                                           const PhiloxKernelKey& key, Emit emit) {
  const int64_t run = box.dims == 0 ? 1 : box.extent[box.dims - 1];
  for (int64_t first = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * kPerThread;
       first < total; first += static_cast<int64_t>(gridDim.x) * blockDim.x * kPerThread) {
    int64_t o = first;
    int64_t g = GlobalIndex(o, box);
    int64_t left = run - o % run;
    uint64_t block = static_cast<uint64_t>(g) >> 2;
    uint32_t words[4];
    PhiloxBlock(block, key, words);
    const int64_t stop = first + kPerThread < total ? first + kPerThread : total;
    for (; o < stop; ++o, ++g, --left) {
      if (left == 0) {  // next run of the box: its own global start
        g = GlobalIndex(o, box);
        left = run;
      }
      if ((static_cast<uint64_t>(g) >> 2) != block) {
        block = static_cast<uint64_t>(g) >> 2;
        PhiloxBlock(block, key, words);
      }
      emit(o, words[g & 3]);
    }
  }
}

__global__ void UniformKernel(float* out, int64_t total, PhiloxBox box, PhiloxKernelKey key) {
  ForOutputs(total, box, key, [&](int64_t o, uint32_t word) {
    out[o] = static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
  });
}

template <typename T>
__device__ __forceinline__ float ToFloat(T v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ float ToFloat(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float v) {
  return static_cast<T>(v);
}
template <>
__device__ __forceinline__ __half FromFloat(float v) {
  return __float2half(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat(float v) {
  return __float2bfloat16(v);
}

template <typename T>
__global__ void DropoutKernel(const T* in, T* out, int64_t total, PhiloxBox box,
                              PhiloxKernelKey key, uint32_t threshold, float scale) {
  ForOutputs(total, box, key, [&](int64_t o, uint32_t word) {
    out[o] = (word >> 8) >= threshold ? FromFloat<T>(ToFloat(in[o]) * scale) : FromFloat<T>(0.0f);
  });
}

__global__ void DropoutKernelDouble(const double* in, double* out, int64_t total, PhiloxBox box,
                                    PhiloxKernelKey key, uint32_t threshold, double scale) {
  ForOutputs(total, box, key, [&](int64_t o, uint32_t word) {
    out[o] = (word >> 8) >= threshold ? in[o] * scale : 0.0;
  });
}

unsigned Blocks(int64_t total) {
  const int64_t blocks = (total + 256 * kPerThread - 1) / (256 * kPerThread);
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

}  // namespace

cudaError_t LaunchPhiloxUniform(float* out, int64_t total, const PhiloxBox& box,
                                const PhiloxKernelKey& key, cudaStream_t stream) {
  if (total == 0) return cudaSuccess;
  UniformKernel<<<Blocks(total), 256, 0, stream>>>(out, total, box, key);
  return cudaGetLastError();
}

cudaError_t LaunchPhiloxDropout(const void* in, void* out, DropoutType type, int64_t total,
                                const PhiloxBox& box, const PhiloxKernelKey& key,
                                uint32_t threshold, double scale, cudaStream_t stream) {
  if (total == 0) return cudaSuccess;
  const float scale_f = static_cast<float>(scale);
  switch (type) {
    case DropoutType::kFloat:
      DropoutKernel<float><<<Blocks(total), 256, 0, stream>>>(static_cast<const float*>(in),
                                                              static_cast<float*>(out), total, box,
                                                              key, threshold, scale_f);
      break;
    case DropoutType::kDouble:
      DropoutKernelDouble<<<Blocks(total), 256, 0, stream>>>(static_cast<const double*>(in),
                                                             static_cast<double*>(out), total, box,
                                                             key, threshold, scale);
      break;
    case DropoutType::kHalf:
      DropoutKernel<__half><<<Blocks(total), 256, 0, stream>>>(static_cast<const __half*>(in),
                                                               static_cast<__half*>(out), total,
                                                               box, key, threshold, scale_f);
      break;
    case DropoutType::kBFloat16:
      DropoutKernel<__nv_bfloat16><<<Blocks(total), 256, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(in), static_cast<__nv_bfloat16*>(out), total, box, key,
          threshold, scale_f);
      break;
  }
  return cudaGetLastError();
}

}  // namespace internal
}  // namespace rng
}  // namespace lockstep
