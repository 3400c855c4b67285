// The variability checks of qualify (qualification/variability.h), on every rank: the
// first round's repeatability, the actors' saved state and first actor, packing_invariance; and
// the second round's actor, which compares its rank's two actors.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "numerics/deterministic_mode.h"
#include "qualification/qualification.h"
#include "qualification/variability.h"

namespace lockstep {
namespace qualification {
namespace {

constexpr char kActorState[] = "/actor_state";
constexpr char kFirstActor[] = "/actor_a";
constexpr char kSecondActor[] = "/actor_b";

absl::StatusOr<std::unique_ptr<VariabilityRank>> VariabilityRankOf(RankSetup& setup) {
  LOCKSTEP_ASSIGN_OR_RETURN(const c10::Device device, RankDevice(setup));
  return VariabilityRank::Create(setup.groups.world(), setup.groups.topology(), setup.control,
                                 device);
}

// The check's result, saying whether lockstep's deterministic mode was enforced in this process
// (qualify --deterministic) and still held when the check ended: without it the checks run
// under the qualification's own scoped settings (DeterministicMode in variability.h).
CheckResult ResultOf(VariabilityCheck check) {
  const bool enforced = numerics::DeterministicModeEnforced();
  const absl::Status holds = numerics::VerifyDeterministicMode();
  if (enforced) {
    absl::StrAppend(&check.detail, holds.ok() ? "; lockstep's deterministic mode enforced"
                                              : "; lockstep's deterministic mode NO LONGER HOLDS");
  }
  CheckResult r = CheckResult::Make(
      std::move(check.name), check.passed && (!enforced || holds.ok()), std::move(check.detail));
  r.evidence = std::move(check.evidence);
  if (!r.evidence.is_object()) r.evidence = nlohmann::json::object();
  r.evidence["deterministic_mode"] = {{"enforced", enforced},
                                      {"holds", holds.ok()},
                                      {"why_not", holds.ok() ? "" : std::string(holds.message())}};
  return r;
}

}  // namespace

absl::StatusOr<std::vector<CheckResult>> CheckVariability(RankSetup& setup) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<VariabilityRank> rank, VariabilityRankOf(setup));
  std::vector<CheckResult> results;
  LOCKSTEP_ASSIGN_OR_RETURN(VariabilityCheck repeatability, rank->Repeatability());
  results.push_back(ResultOf(std::move(repeatability)));
  if (!setup.ledger_dir.empty()) {
    // The first of the two actors; the driver starts the second in processes of its own.
    const std::string state = setup.ledger_dir + kActorState;
    LOCKSTEP_RETURN_IF_ERROR(rank->SaveActorState(state));
    LOCKSTEP_RETURN_IF_ERROR(rank->RunActor(state, setup.ledger_dir + kFirstActor));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(VariabilityCheck packing, rank->PackingInvariance());
  results.push_back(ResultOf(std::move(packing)));
  return results;
}

absl::StatusOr<CheckResult> CheckSecondActor(RankSetup& setup) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<VariabilityRank> rank, VariabilityRankOf(setup));
  const std::string& dir = setup.ledger_dir;
  LOCKSTEP_RETURN_IF_ERROR(rank->RunActor(dir + kActorState, dir + kSecondActor));
  LOCKSTEP_RETURN_IF_ERROR(setup.groups.world().Barrier());
  // Each rank compares its own two actors: both wrote their evidence on this rank's host.
  LOCKSTEP_ASSIGN_OR_RETURN(
      VariabilityCheck check,
      CompareActors(dir + kFirstActor, dir + kSecondActor, setup.groups.world().rank()));
  return ResultOf(std::move(check));
}

}  // namespace qualification
}  // namespace lockstep
