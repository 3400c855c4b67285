// qualification/internal/oracle_compare.h
//
// Private to qualification/: the trainer oracle's comparisons (oracle.cc): one list of tensors
// across the members of a group, and a run's lists against the unsplit reference's, with the
// largest figures seen.
//
// Thread-safety: stateless.

#ifndef LOCKSTEP_QUALIFICATION_INTERNAL_ORACLE_COMPARE_H_
#define LOCKSTEP_QUALIFICATION_INTERNAL_ORACLE_COMPARE_H_

#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "numerics/compare.h"

namespace lockstep {
namespace qualification {
namespace internal {

// Whether every member of `group` (null: none) holds the same `tensors`; `disagreeing` counts the
// members whose list differs from this member's. Collective.
absl::StatusOr<bool> AllEqualAcross(collectives::Communicator* group,
                                    const std::vector<at::Tensor>& tensors, int* disagreeing);

// The largest figures of every comparison made.
struct Figures {
  int compared = 0;
  int bitwise_equal = 0;
  double max_abs_diff = 0;
  double max_relative_l2 = 0;
};

// Compares lists under `tolerance`, appending each failure's summary to `failures` and the
// figures to `figures`.
absl::Status CompareLists(const std::vector<at::Tensor>& actual,
                          const std::vector<at::Tensor>& expected, const std::string& what,
                          const numerics::Tolerance& tolerance, Figures& figures,
                          std::vector<std::string>& failures);

}  // namespace internal
}  // namespace qualification
}  // namespace lockstep

#endif  // LOCKSTEP_QUALIFICATION_INTERNAL_ORACLE_COMPARE_H_
