#include "trainer/internal/contract_seams.h"

#include <utility>

#include "base/status_macros.h"

namespace lockstep {
namespace trainer {
namespace internal {

absl::StatusOr<std::unique_ptr<TrainerRank>> CreateWithSeams(
    TrainerConfig config, TrainerRank::Collaborators collaborators, ForwardAdapter forward,
    const ContractSeams& seams) {
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::shared_ptr<TrainerCore> core,
      TrainerCore::Create(std::move(config), std::move(collaborators), std::move(forward), seams));
  return std::make_unique<TrainerRank>(std::move(core));
}

}  // namespace internal
}  // namespace trainer
}  // namespace lockstep
