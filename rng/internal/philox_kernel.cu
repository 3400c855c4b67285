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

// Element types and the type their scaling is computed in: double in double, the rest in float
// (as the CPU path does), so both round alike.
template <typename T>
struct Compute {
  using type = float;
  __device__ static float In(T v) { return static_cast<float>(v); }
  __device__ static T Out(float v) { return static_cast<T>(v); }
};
template <>
struct Compute<double> {
  using type = double;
  __device__ static double In(double v) { return v; }
  __device__ static double Out(double v) { return v; }
};
template <>
struct Compute<__half> {
  using type = float;
  __device__ static float In(__half v) { return __half2float(v); }
  __device__ static __half Out(float v) { return __float2half(v); }
};
template <>
struct Compute<__nv_bfloat16> {
  using type = float;
  __device__ static float In(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 Out(float v) { return __float2bfloat16(v); }
};

template <typename T>
__global__ void DropoutKernel(const T* in, T* out, int64_t total, PhiloxBox box,
                              PhiloxKernelKey key, uint32_t threshold,
                              typename Compute<T>::type scale) {
  using C = Compute<T>;
  ForOutputs(total, box, key, [&](int64_t o, uint32_t word) {
    out[o] = (word >> 8) >= threshold ? C::Out(C::In(in[o]) * scale) : C::Out(0);
  });
}

// Note [Contiguous dropout]: most boxes (a CP shard of whole rows, a full tensor) are one run of
// global indices g0 .. g0 + total - 1. Then no index decomposition is needed: a thread takes
// kBlocks consecutive Philox blocks (global indices 4b .. 4b + 4 kBlocks - 1, b a multiple of
// kBlocks; two blocks for 2-byte types, so that each thread moves 16 bytes), draws them and
// applies their words to the elements that lie in the box, with one vector load and store when
// the blocks lie wholly inside and the pointers allow it. The words per element are the general
// kernel's (element g takes word g & 3 of block g >> 2), so the bits are the same.
template <typename T>
constexpr int kBlocks = sizeof(T) == 2 ? 2 : 1;

template <typename T>
struct alignas(4 * kBlocks<T> * sizeof(T)) Lanes {
  T v[4 * kBlocks<T>];
};

template <typename T>
__global__ void ContiguousDropoutKernel(const T* in, T* out, int64_t g0, int64_t total,
                                        PhiloxKernelKey key, uint32_t threshold,
                                        typename Compute<T>::type scale, bool vector) {
  using C = Compute<T>;
  constexpr int kB = kBlocks<T>, kN = 4 * kB;
  const uint64_t first_block = (static_cast<uint64_t>(g0) >> 2) / kB * kB;
  const uint64_t last_block = static_cast<uint64_t>(g0 + total - 1) >> 2;
  for (uint64_t b =
           first_block + (blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x) * kB;
       b <= last_block; b += static_cast<uint64_t>(gridDim.x) * blockDim.x * kB) {
    uint32_t words[kN];
#pragma unroll
    for (int j = 0; j < kB; ++j) PhiloxBlock(b + j, key, words + 4 * j);
    const int64_t base = static_cast<int64_t>(b << 2) - g0;  // output index of word 0
    if (vector && base >= 0 && base + kN <= total) {
      const Lanes<T> x = *reinterpret_cast<const Lanes<T>*>(in + base);
      Lanes<T> y;
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        y.v[j] = (words[j] >> 8) >= threshold ? C::Out(C::In(x.v[j]) * scale) : C::Out(0);
      }
      *reinterpret_cast<Lanes<T>*>(out + base) = y;
      continue;
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      const int64_t o = base + j;
      if (o < 0 || o >= total) continue;
      out[o] = (words[j] >> 8) >= threshold ? C::Out(C::In(in[o]) * scale) : C::Out(0);
    }
  }
}

// The first global index of `box` when its elements are one run of consecutive global indices
// (Note [Contiguous dropout]), else -1: the box's indices are distinct and lie between its first
// and its last element's, so they are consecutive exactly when that span holds `total` of them.
int64_t ContiguousStart(const PhiloxBox& box, int64_t total) {
  int64_t first = 0, last = 0;
  for (int d = 0; d < box.dims; ++d) {
    first += box.begin[d] * box.stride[d];
    last += (box.begin[d] + box.extent[d] - 1) * box.stride[d];
  }
  return last - first + 1 == total ? first : -1;
}

unsigned Blocks(int64_t total) {
  const int64_t blocks = (total + 256 * kPerThread - 1) / (256 * kPerThread);
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

template <typename T>
cudaError_t LaunchDropout(const void* in, void* out, int64_t total, const PhiloxBox& box,
                          const PhiloxKernelKey& key, uint32_t threshold, double scale,
                          cudaStream_t stream) {
  if (total == 0) return cudaSuccess;
  const int64_t g0 = ContiguousStart(box, total);
  if (g0 >= 0) {
    constexpr int kB = kBlocks<T>;
    const bool vector = reinterpret_cast<uintptr_t>(in) % sizeof(Lanes<T>) == 0 &&
                        reinterpret_cast<uintptr_t>(out) % sizeof(Lanes<T>) == 0 &&
                        g0 % (4 * kB) == 0;
    // One thread per kBlocks Philox blocks, from the block of g0 rounded down to kBlocks.
    const int64_t first = (g0 >> 2) / kB * kB, last = (g0 + total - 1) >> 2;
    const int64_t threads = (last - first) / kB + 1;
    const int64_t grid = (threads + 255) / 256;
    ContiguousDropoutKernel<T>
        <<<static_cast<unsigned>(grid < (1 << 20) ? grid : (1 << 20)), 256, 0, stream>>>(
            static_cast<const T*>(in), static_cast<T*>(out), g0, total, key, threshold,
            static_cast<typename Compute<T>::type>(scale), vector);
    return cudaGetLastError();
  }
  DropoutKernel<T><<<Blocks(total), 256, 0, stream>>>(
      static_cast<const T*>(in), static_cast<T*>(out), total, box, key, threshold,
      static_cast<typename Compute<T>::type>(scale));
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchPhiloxUniform(float* out, int64_t total, const PhiloxBox& box,
                                const PhiloxKernelKey& key, cudaStream_t stream) {
  if (total == 0) return cudaSuccess;
  UniformKernel<<<Blocks(total), 256, 0, stream>>>(out, total, box, key);
  return cudaGetLastError();
}

cudaError_t LaunchPhiloxDropout(const void* in, void* out, ElementType type, int64_t total,
                                const PhiloxBox& box, const PhiloxKernelKey& key,
                                uint32_t threshold, double scale, cudaStream_t stream) {
  switch (type) {
    case ElementType::kFloat:
      return LaunchDropout<float>(in, out, total, box, key, threshold, scale, stream);
    case ElementType::kDouble:
      return LaunchDropout<double>(in, out, total, box, key, threshold, scale, stream);
    case ElementType::kHalf:
      return LaunchDropout<__half>(in, out, total, box, key, threshold, scale, stream);
    case ElementType::kBFloat16:
      return LaunchDropout<__nv_bfloat16>(in, out, total, box, key, threshold, scale, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace internal
}  // namespace rng
}  // namespace lockstep
