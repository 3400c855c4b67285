// rng/internal/philox_cuda.h
//
// Private to rng/: the CUDA half of philox.h. In --config=cuda builds it launches the Philox
// kernel (philox_kernel.cu); elsewhere it reports that CUDA is not built in.

#ifndef LOCKSTEP_RNG_INTERNAL_PHILOX_CUDA_H_
#define LOCKSTEP_RNG_INTERNAL_PHILOX_CUDA_H_

#include <cstdint>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "rng/philox_key.h"

namespace lockstep {
namespace rng {
namespace internal {

// Uniforms of `box` on CUDA `device`; `strides` are the global row-major strides.
absl::StatusOr<at::Tensor> CudaPhilox(const PhiloxKey& key, const std::vector<int64_t>& strides,
                                      absl::Span<const Slice> box, c10::Device device);

// Dropout of the CUDA tensor `shard` (the box of the global tensor), in one fused kernel.
absl::StatusOr<at::Tensor> CudaPhiloxDropout(const at::Tensor& shard, const PhiloxKey& key,
                                             const std::vector<int64_t>& strides,
                                             absl::Span<const Slice> box, uint32_t threshold,
                                             double scale);

}  // namespace internal
}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_INTERNAL_PHILOX_CUDA_H_
