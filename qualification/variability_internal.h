// qualification/variability_internal.h
//
// Internal to the variability checks (variability.h): the recorded step that repeatability, actors
// and packing_invariance share (their comparisons: numerics/variability_evidence.h).

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

}  // namespace variability
}  // namespace qualification
}  // namespace lockstep

#endif  // LOCKSTEP_QUALIFICATION_VARIABILITY_INTERNAL_H_
