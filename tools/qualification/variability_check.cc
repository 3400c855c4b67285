// The variability checks of qualify (trainer/qualification/variability.h), on every rank.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "tools/qualification.h"
#include "trainer/qualification/variability.h"

namespace lockstep {
namespace qualification {

absl::StatusOr<std::vector<CheckResult>> CheckVariability(RankSetup& setup) {
  LOCKSTEP_ASSIGN_OR_RETURN(const c10::Device device, RankDevice(setup));
  const trainer::VariabilityControl control = setup.control == NegativeControl::kNondeterministicOp
                                                  ? trainer::VariabilityControl::kNondeterministicOp
                                                  : trainer::VariabilityControl::kNone;
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::unique_ptr<trainer::VariabilityRank> rank,
      trainer::VariabilityRank::Create(*setup.world, setup.topology, control, device));
  auto result = [](trainer::VariabilityCheck check) {
    CheckResult r = CheckResult::Make(std::move(check.name), check.passed, std::move(check.detail));
    r.evidence = std::move(check.evidence);
    return r;
  };
  std::vector<CheckResult> results;
  LOCKSTEP_ASSIGN_OR_RETURN(trainer::VariabilityCheck repeatability, rank->Repeatability());
  results.push_back(result(std::move(repeatability)));
  if (!setup.ledger_dir.empty()) {
    // The first of the two actors; the driver starts the second in processes of its own.
    const std::string state = absl::StrCat(setup.ledger_dir, "/actor_state");
    LOCKSTEP_RETURN_IF_ERROR(rank->SaveActorState(state));
    LOCKSTEP_RETURN_IF_ERROR(rank->RunActor(state, absl::StrCat(setup.ledger_dir, "/actor_a")));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(trainer::VariabilityCheck packing, rank->PackingInvariance());
  results.push_back(result(std::move(packing)));
  return results;
}

}  // namespace qualification
}  // namespace lockstep
