// numerics/named_tensors.h
//
// A set of named tensors as numerics' functions take and return it: a model's parameters and
// buffers, an optimizer state, the contents of a safetensors file. Order is the caller's; the
// functions that need names unique say so.

#ifndef LOCKSTEP_NUMERICS_NAMED_TENSORS_H_
#define LOCKSTEP_NUMERICS_NAMED_TENSORS_H_

#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"

namespace lockstep {
namespace numerics {

// (name, tensor) pairs, in the caller's order (see the top of this file).
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_NAMED_TENSORS_H_
