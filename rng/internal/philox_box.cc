#include "rng/internal/philox_box.h"

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace rng {
namespace internal {
absl::StatusOr<std::vector<int64_t>> CheckBox(absl::Span<const int64_t> global_shape,
                                              absl::Span<const Slice> box) {
  if (box.size() != global_shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the box has ", box.size(), " dimensions, the global shape ", global_shape.size()));
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
