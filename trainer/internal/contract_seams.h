// trainer/internal/contract_seams.h  (for negative controls only: trainer/, tools/)
//
// A TrainerRank with parts of its RNG contract turned off (internal::ContractSeams in
// trainer_core.h), so that the oracle and qualify can show that each of their checks fails when
// the part it checks is missing. Bazel visibility keeps it out of reach of production code.
//
// Example:
//   internal::ContractSeams seams;
//   seams.synchronize_after_all_microbatches = false;  // the control
//   LOCKSTEP_ASSIGN_OR_RETURN(auto trainer,
//                             internal::CreateWithSeams(config, collaborators, forward, seams));

#ifndef LOCKSTEP_TRAINER_INTERNAL_CONTRACT_SEAMS_H_
#define LOCKSTEP_TRAINER_INTERNAL_CONTRACT_SEAMS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "trainer/internal/trainer_core.h"
#include "trainer/trainer_rank.h"

namespace lockstep {
namespace trainer {
namespace internal {

// TrainerRank::Create with `seams`.
absl::StatusOr<std::unique_ptr<TrainerRank>> CreateWithSeams(
    TrainerConfig config, TrainerRank::Collaborators collaborators, ForwardAdapter forward,
    const ContractSeams& seams);

}  // namespace internal
}  // namespace trainer
}  // namespace lockstep

#endif  // LOCKSTEP_TRAINER_INTERNAL_CONTRACT_SEAMS_H_
