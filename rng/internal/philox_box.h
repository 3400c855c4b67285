// rng/internal/philox_box.h
//
// Private to rng/: the box arithmetic the CPU and CUDA halves of philox.h share.

#ifndef LOCKSTEP_RNG_INTERNAL_PHILOX_BOX_H_
#define LOCKSTEP_RNG_INTERNAL_PHILOX_BOX_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "rng/philox_key.h"

namespace lockstep {
namespace rng {
namespace internal {

// Validates the box against `global_shape` (kInvalidArgument naming the dimension and the bound)
// and returns the global row-major strides.
absl::StatusOr<std::vector<int64_t>> CheckBox(absl::Span<const int64_t> global_shape,
                                              absl::Span<const Slice> box);
// The shape of the box: its extent in every dimension.
std::vector<int64_t> BoxShape(absl::Span<const Slice> box);

}  // namespace internal
}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_INTERNAL_PHILOX_BOX_H_
