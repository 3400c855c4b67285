// numerics/internal/element_value.cuh
//
// Private to numerics/, device code only (nvcc): an element of any ElementType (element_type.h)
// as a double, exactly (every such value has one).

#ifndef LOCKSTEP_NUMERICS_INTERNAL_ELEMENT_VALUE_CUH_
#define LOCKSTEP_NUMERICS_INTERNAL_ELEMENT_VALUE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace lockstep {
namespace numerics {
namespace internal {

template <typename T>
__device__ __forceinline__ double ToDouble(T v) {
  return static_cast<double>(v);
}
template <>
__device__ __forceinline__ double ToDouble(__half v) {
  return static_cast<double>(__half2float(v));
}
template <>
__device__ __forceinline__ double ToDouble(__nv_bfloat16 v) {
  return static_cast<double>(__bfloat162float(v));
}

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_INTERNAL_ELEMENT_VALUE_CUH_
