// base/element_type.h
//
// The element types lockstep's own CUDA kernels read (numerics' comparison and summary kernels,
// rng's partitioned dropout), one plain enum so that nvcc never parses LibTorch and every kernel
// switches over the same names: element_type_of.h maps a LibTorch dtype onto it on the host;
// numerics/internal/element_value.cuh reads an element as a double on the device. A kernel that
// reads only some of them returns cudaErrorInvalidValue for the others, and its host side refuses
// them first, naming the dtype.

#ifndef LOCKSTEP_BASE_ELEMENT_TYPE_H_
#define LOCKSTEP_BASE_ELEMENT_TYPE_H_

namespace lockstep {

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

}  // namespace lockstep

#endif  // LOCKSTEP_BASE_ELEMENT_TYPE_H_
