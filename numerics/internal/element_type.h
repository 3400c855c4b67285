// numerics/internal/element_type.h
//
// Private to numerics/: the element types lockstep's own CUDA kernels read (the comparison,
// compare_kernel.cu, and the summary, summary_kernel.cu), a plain enum so that nvcc never parses
// LibTorch: element_type_of.h maps a LibTorch dtype onto it on the host, element_value.cuh reads
// an element as a double on the device.

#ifndef LOCKSTEP_NUMERICS_INTERNAL_ELEMENT_TYPE_H_
#define LOCKSTEP_NUMERICS_INTERNAL_ELEMENT_TYPE_H_

namespace lockstep {
namespace numerics {
namespace internal {

enum class ElementType {
  kDouble,
  kFloat,
  kHalf,
  kBFloat16,
  kInt64,
  kInt32,
  kInt16,
  kInt8,
  kUInt8,
  kBool
};

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_INTERNAL_ELEMENT_TYPE_H_
