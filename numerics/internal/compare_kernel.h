// numerics/internal/compare_kernel.h
//
// Private to numerics/: the fused CUDA comparison of two device buffers (numerics/compare.h's
// figures in one pass over both inputs), compiled by nvcc (compare_kernel.cu). Plain C++
// interface, so nvcc never parses LibTorch.

#ifndef LOCKSTEP_NUMERICS_INTERNAL_COMPARE_KERNEL_H_
#define LOCKSTEP_NUMERICS_INTERNAL_COMPARE_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/element_type.h"
#include "numerics/internal/compare_visit.h"

namespace lockstep {
namespace numerics {
namespace internal {

inline constexpr int kComparePartials = 1056;  // blocks of the grid (8 per SM of an H200)

// Compares `n` elements of `a` and `b` (device memory, contiguous, of `type`), writing
// kComparePartials partials to `partials` (device memory), on `stream`.
cudaError_t LaunchCompare(const void* a, const void* b, int64_t n, ElementType type, double atol,
                          double rtol, bool nan_equal, ComparePartial* partials,
                          cudaStream_t stream);

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_INTERNAL_COMPARE_KERNEL_H_
