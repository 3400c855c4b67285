#include "trainer/internal/contract_seams.h"

#include <utility>

#include "base/status_macros.h"

namespace lockstep {
namespace trainer {
namespace internal {

absl::StatusOr<std::unique_ptr<TrainerRank>> CreateWithSeams(
    TrainerConfig config, TrainerRank::Collaborators collaborators, ForwardAdapter forward,
    const ContractSeams& seams) {
  Collaborators checked{std::move(collaborators.topology), collaborators.world_rank,
                        std::move(collaborators.tp_cp_group), std::move(collaborators.streams)};
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::shared_ptr<TrainerCore> core,
      TrainerCore::Create(std::move(config), std::move(checked), std::move(forward), seams));
  return std::make_unique<TrainerRank>(std::move(core));
}

}  // namespace internal
}  // namespace trainer
}  // namespace lockstep
