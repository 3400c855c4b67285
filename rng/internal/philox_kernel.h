// rng/internal/philox_kernel.h
//
// Private to rng/: the CUDA kernels of philox.h, compiled by nvcc (philox_kernel.cu) and called
// from philox_cuda.cc. Plain C++ interface (no LibTorch types), so nvcc never parses LibTorch.
// Element o of a box gets global index sum_d (begin[d] + coordinate_d(o)) * stride[d] and the
// same Philox word as the CPU implementation in philox.cc.

#ifndef LOCKSTEP_RNG_INTERNAL_PHILOX_KERNEL_H_
#define LOCKSTEP_RNG_INTERNAL_PHILOX_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/element_type.h"

namespace lockstep {
namespace rng {
namespace internal {

inline constexpr int kMaxPhiloxDims = 8;

struct PhiloxBox {
  int dims = 0;
  int64_t begin[kMaxPhiloxDims] = {};
  int64_t extent[kMaxPhiloxDims] = {};
  int64_t stride[kMaxPhiloxDims] = {};
};

struct PhiloxKernelKey {
  uint64_t seed;
  uint32_t stream;
  uint32_t step;
};

// out[o] = uniform of element o, for o in [0, total).
cudaError_t LaunchPhiloxUniform(float* out, int64_t total, const PhiloxBox& box,
                                const PhiloxKernelKey& key, cudaStream_t stream);

// out[o] = in[o] * scale where the element's 24-bit word >= threshold, else 0. `type`: kFloat,
// kDouble, kHalf or kBFloat16 (cudaErrorInvalidValue for another).
cudaError_t LaunchPhiloxDropout(const void* in, void* out, ElementType type, int64_t total,
                                const PhiloxBox& box, const PhiloxKernelKey& key,
                                uint32_t threshold, double scale, cudaStream_t stream);

}  // namespace internal
}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_INTERNAL_PHILOX_KERNEL_H_
