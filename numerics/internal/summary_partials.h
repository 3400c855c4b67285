// numerics/internal/summary_partials.h
//
// Private to numerics/: the host's half of a device summary (Note [Summary partials] in
// summary_kernel.h): the partials, back as bytes, finished in block order.

#ifndef LOCKSTEP_NUMERICS_INTERNAL_SUMMARY_PARTIALS_H_
#define LOCKSTEP_NUMERICS_INTERNAL_SUMMARY_PARTIALS_H_

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/string_view.h"

namespace lockstep {
namespace numerics {
namespace internal {

// {sum, max |x|} of partials given as 16 bytes each (a double sum, a double max |x|, host byte
// order). A NaN in any partial makes both NaN. Precondition: bytes.size() is a multiple of 16.
inline std::pair<double, double> FinishSummaryPartials(absl::string_view bytes) {
  double sum = 0;
  double max_abs = 0;
  for (size_t at = 0; at + 16 <= bytes.size(); at += 16) {
    double part[2];
    std::memcpy(part, bytes.data() + at, sizeof(part));
    sum += part[0];
    if (std::isnan(part[1]) || std::isnan(max_abs)) {
      max_abs = std::nan("");
    } else if (part[1] > max_abs) {
      max_abs = part[1];
    }
  }
  return {sum, max_abs};
}

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_INTERNAL_SUMMARY_PARTIALS_H_
