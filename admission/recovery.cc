#include "admission/recovery.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace lockstep {
namespace admission {

absl::StatusOr<std::unique_ptr<RecoveringRunner>> RecoveringRunner::Create(
    const Collaborators& collaborators, int64_t cap_bytes, const RecoveryOptions& options) {
  if (collaborators.model == nullptr || collaborators.staging == nullptr) {
    return absl::InvalidArgumentError(
        "recovering runner: a memory model and a contribution staging are required (without a "
        "stage a failed attempt's partial contribution could not be dropped)");
  }
  if (cap_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("recovering runner: cap of ", cap_bytes, " bytes must be positive"));
  }
  if (options.max_split_depth < 0) {
    return absl::InvalidArgumentError(absl::StrCat("recovering runner: max_split_depth ",
                                                   options.max_split_depth, " is negative"));
  }
  return std::unique_ptr<RecoveringRunner>(new RecoveringRunner(collaborators, cap_bytes, options));
}

absl::StatusOr<StepReport> RecoveringRunner::RunStep(int64_t step, const planner::Plan& plan,
                                                     const RunWave& run) {
  RecoveryCollaborators loop_collaborators = RecoveryCollaborators::Of(c_.group);
  loop_collaborators.model = c_.model;
  loop_collaborators.cap_bytes = cap_bytes_;
  loop_collaborators.probe = c_.probe;
  loop_collaborators.ledger = c_.ledger;
  loop_collaborators.writes = LedgerStep::Writes::kDirect;
  LOCKSTEP_ASSIGN_OR_RETURN(RecoveryLoop loop,
                            RecoveryLoop::Begin(loop_collaborators, options_, step, plan));
  AttemptHooks hooks;
  hooks.attempt = [&](const WaveWork& work) -> absl::Status {
    LOCKSTEP_RETURN_IF_ERROR(c_.staging->Begin());
    return run(work);
  };
  hooks.on_success = [&](const WaveWork&) { return c_.staging->Commit(); };
  hooks.on_failure = [&](const WaveWork&) { c_.staging->Discard(); };
  while (!loop.done()) {
    LOCKSTEP_ASSIGN_OR_RETURN(WaveWork wave, loop.RunNext(hooks));
    // The staged contribution joined the accumulated gradient: it counts.
    LOCKSTEP_RETURN_IF_ERROR(loop.Complete(wave));
  }
  StepReport report = loop.report();
  report.final_plan = loop.plan();
  return report;
}

absl::Status RecoveringRunner::CommitStep(int64_t step) {
  if (c_.ledger == nullptr) return absl::OkStatus();
  return c_.ledger->CommitStep(step);
}

}  // namespace admission
}  // namespace lockstep
