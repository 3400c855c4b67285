// base/element_type_of.h
//
// A LibTorch dtype's ElementType (element_type.h), for the host side of lockstep's CUDA kernels;
// none for a dtype no kernel reads (float8, the wide unsigned types, complex), which the callers
// handle through ATen or refuse.

#ifndef LOCKSTEP_BASE_ELEMENT_TYPE_OF_H_
#define LOCKSTEP_BASE_ELEMENT_TYPE_OF_H_

#include <optional>

#include "base/element_type.h"
#include "c10/core/ScalarType.h"

namespace lockstep {

inline std::optional<ElementType> ElementTypeOf(c10::ScalarType t) {
  switch (t) {
    case c10::kDouble:
      return ElementType::kDouble;
    case c10::kFloat:
      return ElementType::kFloat;
    case c10::kHalf:
      return ElementType::kHalf;
    case c10::kBFloat16:
      return ElementType::kBFloat16;
    case c10::kLong:
      return ElementType::kInt64;
    case c10::kInt:
      return ElementType::kInt32;
    case c10::kShort:
      return ElementType::kInt16;
    case c10::kChar:
      return ElementType::kInt8;
    case c10::kByte:
      return ElementType::kUInt8;
    case c10::kBool:
      return ElementType::kBool;
    default:
      return std::nullopt;
  }
}

}  // namespace lockstep

#endif  // LOCKSTEP_BASE_ELEMENT_TYPE_OF_H_
