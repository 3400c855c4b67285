// qualification/variability_internal.h
//
// Internal to the variability checks (variability.h): the recorded step and the comparison of two
// recordings that repeatability, actors and packing_invariance share.

#ifndef LOCKSTEP_QUALIFICATION_VARIABILITY_INTERNAL_H_
#define LOCKSTEP_QUALIFICATION_VARIABILITY_INTERNAL_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "collectives/rank_groups.h"
#include "nlohmann/json.hpp"
#include "numerics/divergence.h"
#include "numerics/named_tensors.h"
#include "qualification/variability.h"
#include "qualification/variability_program.h"

namespace lockstep {
namespace qualification {

// The rank's groups, which the programs of every check run on.
struct VariabilityRank::Groups {
  explicit Groups(collectives::RankGroups made) : rank(std::move(made)) {}
  collectives::RankGroups rank;
  // The programs' view of `rank`'s groups.
  variability::ProgramGroups program;
};

namespace variability {

// The placement of the repeated step: the default budget and packing, dropout on, the module
// the control breaks.
Placement StepPlacement(NegativeControl control);

// The step of FixedBatch(dp_index) with every module and parameter tapped; its recording goes to
// `recording`, its outputs are returned.
absl::StatusOr<numerics::NamedTensors> RecordedStep(Program& program, int dp_index,
                                                    numerics::Recording& recording);

// Every record of `a` against its counterpart in `b`, in execution order: {index, module, kind,
// digest_equal} and, where both kept their tensors, the figures of numerics::CompareTensors under
// the default tolerance (bitwise_equal, max_abs_diff, max_tolerance_ratio, relative_l2, ...).
absl::StatusOr<nlohmann::json> RecordComparisons(const numerics::Recording& a,
                                                 const numerics::Recording& b);

struct RecordingsVerdict {
  std::optional<numerics::Divergence> first;
  // "parameters whose gradient differs: 3 incoming, 1 accumulation", or that none does.
  std::string leaves_summary;
  // {first_divergence, records (RecordComparisons), leaf_gradients: [localization...]}.
  nlohmann::json evidence;
};
absl::StatusOr<RecordingsVerdict> CompareRecordings(const numerics::Recording& a,
                                                    const numerics::Recording& b);

// "first divergence at block1.mlp (forward_output, record 4, digest): max |diff| ..." or that no
// record differs.
std::string DivergenceSummary(const std::optional<numerics::Divergence>& first);

}  // namespace variability
}  // namespace qualification
}  // namespace lockstep

#endif  // LOCKSTEP_QUALIFICATION_VARIABILITY_INTERNAL_H_
