#include "rng/internal/philox_box.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lockstep {
namespace rng {
namespace internal {
absl::StatusOr<std::vector<int64_t>> CheckBox(absl::Span<const int64_t> global_shape,
                                              absl::Span<const Slice> box) {
  if (box.size() != global_shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the box has ", box.size(), " dimensions, the global shape ", global_shape.size()));
  }
  // Every element's global index must be an int64_t: a larger global tensor would wrap its
  // indices (and the strides below), and elements far apart would draw the same numbers. Empty
  // dimensions are left out of the count, which bounds the strides; negative ones are refused
  // below.
  int64_t elements = 1;
  for (int64_t size : global_shape) {
    if (size > 0 && __builtin_mul_overflow(elements, size, &elements)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the global shape ", absl::StrJoin(global_shape, " x "),
                       " has more than 2^63 - 1 elements: element indices would wrap and "
                       "repeat draws"));
    }
  }
  std::vector<int64_t> strides(global_shape.size(), 1);
  for (int d = static_cast<int>(global_shape.size()) - 1; d >= 0; --d) {
    if (global_shape[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("global dimension ", d, " has negative size ", global_shape[d]));
    }
    if (box[d].begin < 0 || box[d].begin > box[d].end || box[d].end > global_shape[d]) {
      return absl::InvalidArgumentError(absl::StrCat("box [", box[d].begin, ", ", box[d].end,
                                                     ") of dimension ", d,
                                                     " does not fit its size ", global_shape[d]));
    }
    if (d + 1 < static_cast<int>(global_shape.size())) {
      strides[d] = strides[d + 1] * global_shape[d + 1];
    }
  }
  return strides;
}
std::vector<int64_t> BoxShape(absl::Span<const Slice> box) {
  std::vector<int64_t> shape;
  for (const Slice& s : box) shape.push_back(s.end - s.begin);
  return shape;
}

}  // namespace internal
}  // namespace rng
}  // namespace lockstep
