#include "admission/recovery_loop.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "collectives/agreement.h"
#include "collectives/outcome.h"
#include "planner/plan_agreement.h"
#include "planner/planner.h"

namespace lockstep {
namespace admission {
namespace {

int IndexOf(const std::vector<std::string>& ids, const std::string& id) {
  return static_cast<int>(std::find(ids.begin(), ids.end(), id) - ids.begin());
}

int SplitDepth(const std::string& id) {
  return static_cast<int>(std::count(id.begin(), id.end(), '.'));
}

}  // namespace

absl::StatusOr<RecoveryLoop> RecoveryLoop::Begin(const RecoveryCollaborators& collaborators,
                                                 const RecoveryOptions& options, int64_t step,
                                                 planner::Plan plan) {
  if (collaborators.model != nullptr && collaborators.cap_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("recovery: cap of ", collaborators.cap_bytes, " bytes must be positive"));
  }
  if (options.max_split_depth < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("recovery: max_split_depth ", options.max_split_depth, " is negative"));
  }
  if (plan.microbatches_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("recovery: step ", step, " has no microbatches"));
  }
  // The waves follow from the model and the cap, which must agree for the waves' collectives to:
  // they are part of what the group agrees on, and so is a refusal, so that a member that
  // refuses never leaves the others waiting in the agreement.
  std::vector<Wave> waves;
  std::string execution;
  absl::Status admitted = absl::OkStatus();
  if (collaborators.model != nullptr) {
    absl::StatusOr<Admission> admission =
        AdmitWaves(plan, *collaborators.model, collaborators.cap_bytes, options.admission);
    admitted = admission.status();
    if (admission.ok()) waves = std::move(admission->waves);
    if (collectives::WithOthers(collaborators.group) !=
        nullptr) {  // what the group agrees on; alone, nothing
      execution = absl::StrCat("waves under ", collaborators.cap_bytes, " bytes by ",
                               collaborators.model->Serialize(), ": ",
                               admitted.ok() ? "admitted" : admitted.ToString());
    }
  } else {
    for (int m = 0; m < plan.microbatches_size(); ++m) {
      Wave wave;
      wave.microbatches = {m};
      waves.push_back(std::move(wave));
    }
  }
  if (collectives::Communicator* group = collectives::WithOthers(collaborators.group)) {
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(planner::CheckPlanAgreement(*group, plan, execution),
                                          absl::StrCat("beginning step ", step));
  }
  LOCKSTEP_RETURN_IF_ERROR(admitted);
  LOCKSTEP_ASSIGN_OR_RETURN(
      LedgerStep ledger, LedgerStep::Begin(collaborators.ledger, step, plan, collaborators.writes));
  RecoveryLoop loop(collaborators, options, std::move(plan), std::move(ledger));
  loop.report_.step = step;
  for (int m = 0; m < loop.plan_.microbatches_size(); ++m) loop.ids_.push_back(absl::StrCat(m));
  for (const Wave& wave : waves) {
    PendingWave pending;
    for (int m : wave.microbatches) pending.ids.push_back(loop.ids_[m]);
    loop.pending_.push_back(std::move(pending));
  }
  return loop;
}

WaveWork RecoveryLoop::Describe(const PendingWave& wave) const {
  WaveWork work;
  work.step = report_.step;
  work.plan = &plan_;
  work.ids = wave.ids;
  WorkShape shape;
  for (const std::string& id : wave.ids) {
    const int index = IndexOf(ids_, id);
    work.microbatches.push_back(index);
    const std::vector<TokenRange> ranges = TokenRangesOf(plan_, index);
    work.ranges.insert(work.ranges.end(), ranges.begin(), ranges.end());
    shape = shape + ShapeOfMicrobatch(plan_, index);
  }
  if (c_.model != nullptr) work.predicted_bytes = c_.model->Predict(shape);
  return work;
}

absl::StatusOr<WaveWork> RecoveryLoop::RunNext(const AttemptHooks& hooks) {
  absl::StatusOr<WaveWork> result = [&]() -> absl::StatusOr<WaveWork> {
    while (!pending_.empty()) {
      PendingWave wave = std::move(pending_.front());
      pending_.pop_front();
      const WaveWork work = Describe(wave);
      const std::string id = absl::StrJoin(wave.ids, "+");
      const std::string name =
          absl::StrCat("step ", report_.step, ", microbatch ", id, ", attempt ", work.attempt);
      report_.max_predicted_bytes = std::max(report_.max_predicted_bytes, work.predicted_bytes);
      ++report_.attempts;
      if (c_.probe != nullptr) LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(c_.probe->ResetPeak(), name);

      absl::Status local;
      const absl::Status thrown = CallTorch(name, [&] { local = hooks.attempt(work); });
      if (!thrown.ok()) local = thrown;
      // The attempt's records follow its local part, off the path before it.
      if (ledger_.recording()) {  // the records' strings are built only for a ledger
        if (wave.after_failure) {
          LOCKSTEP_RETURN_IF_ERROR(ledger_.Record(LedgerEventKind::kRetried, id, work.ranges));
        }
        LOCKSTEP_RETURN_IF_ERROR(ledger_.Record(
            LedgerEventKind::kAdmitted, id, work.ranges,
            c_.model == nullptr ? "no memory model"
                                : absl::StrCat("predicted ", FormatBytes(work.predicted_bytes),
                                               " of ", FormatBytes(c_.cap_bytes))));
        LOCKSTEP_RETURN_IF_ERROR(ledger_.Record(LedgerEventKind::kStarted, id, work.ranges));
      }

      absl::StatusOr<collectives::GroupOutcome> agreed =
          collectives::AgreeOnOutcome(collectives::WithOthers(c_.group), local);
      if (!agreed.ok()) {
        if (hooks.on_failure) hooks.on_failure(work);
        return Annotate(agreed.status(), absl::StrCat(name, ": agreeing on the attempt's outcome"));
      }
      if (agreed->ok()) {
        if (hooks.on_success) LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(hooks.on_success(work), name);
        if (c_.probe != nullptr) {
          absl::StatusOr<MemoryReading> reading = c_.probe->Read();
          if (reading.ok()) {
            report_.max_measured_peak_bytes =
                std::max(report_.max_measured_peak_bytes, reading->peak_allocated_bytes);
          }
        }
        ++report_.waves_run;
        return work;
      }
      if (hooks.on_failure) hooks.on_failure(work);
      const std::string failure = !local.ok()
                                      ? std::string(local.message())
                                      : absl::StrCat("global rank ", agreed->first_failed_global,
                                                     ": ", agreed->first_failure.message());
      if (!agreed->only_out_of_memory() || c_.model == nullptr) {
        // A failure no split can cure: every member stops, naming the first failing member.
        ledger_.Record(LedgerEventKind::kFailed, id, work.ranges, failure).IgnoreError();
        return agreed->ForMember(local, name);
      }
      ++report_.out_of_memory;
      LOCKSTEP_RETURN_IF_ERROR(ledger_.Record(LedgerEventKind::kFailed, id, work.ranges,
                                              absl::StrCat("out of memory: ", failure)));
      if (c_.probe != nullptr) {
        LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(c_.probe->ReleaseCachedMemory(), name);
      }
      WorkShape shape;
      for (int m : work.microbatches) shape = shape + ShapeOfMicrobatch(plan_, m);
      c_.model->CorrectAfterOom(shape, c_.cap_bytes);
      LOCKSTEP_RETURN_IF_ERROR(Split(work, name));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("recovery: step ", report_.step, " has no work left to run"));
  }();
  if (!result.ok()) failed_ = true;
  return result;
}

absl::Status RecoveryLoop::Split(const WaveWork& work, const std::string& name) {
  const std::string id = absl::StrJoin(work.ids, "+");
  if (work.ids.size() > 1) {
    // A wave of several microbatches: its halves run as separate waves.
    ++report_.wave_splits;
    const size_t half = work.ids.size() / 2;
    PendingWave first{std::vector<std::string>(work.ids.begin(), work.ids.begin() + half), true};
    PendingWave second{std::vector<std::string>(work.ids.begin() + half, work.ids.end()), true};
    LOCKSTEP_RETURN_IF_ERROR(
        ledger_.Record(LedgerEventKind::kSplit, id, work.ranges,
                       absl::StrCat("wave into ", absl::StrJoin(first.ids, "+"), " and ",
                                    absl::StrJoin(second.ids, "+"))));
    pending_.push_front(std::move(second));
    pending_.push_front(std::move(first));
    return absl::OkStatus();
  }
  if (SplitDepth(id) >= options_.max_split_depth) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name, ": microbatch ", id, " ran out of memory after ", SplitDepth(id),
                     " splits (max_split_depth ", options_.max_split_depth, "); cap ",
                     FormatBytes(c_.cap_bytes)));
  }
  const int at = work.microbatches[0];
  absl::StatusOr<planner::Plan> split = planner::SplitMicrobatch(plan_, at);
  if (!split.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(name, ": microbatch ", id,
                                                     " ran out of memory and cannot be split "
                                                     "further: ",
                                                     split.status().message()));
  }
  ++report_.microbatch_splits;
  plan_ = std::move(*split);
  ids_[at] = absl::StrCat(id, ".1");
  ids_.insert(ids_.begin() + at, absl::StrCat(id, ".0"));
  LOCKSTEP_RETURN_IF_ERROR(ledger_.Record(
      LedgerEventKind::kSplit, id, work.ranges,
      absl::StrCat("microbatch into ", ids_[at], " (", plan_.microbatches(at).num_tokens(),
                   " tokens) and ", ids_[at + 1], " (", plan_.microbatches(at + 1).num_tokens(),
                   " tokens)")));
  if (collectives::Communicator* group = collectives::WithOthers(c_.group)) {
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
        collectives::CheckAgreement(
            *group, "admission/split",
            absl::StrCat(DigestHex(planner::PlanDigest(plan_)), "/", absl::StrJoin(ids_, ","))),
        absl::StrCat(name, ": agreeing on the split"));
  }
  pending_.push_front(PendingWave{{ids_[at + 1]}, true});
  pending_.push_front(PendingWave{{ids_[at]}, true});
  return absl::OkStatus();
}

absl::Status RecoveryLoop::Complete(const WaveWork& wave) {
  const std::string id = absl::StrJoin(wave.ids, "+");
  LOCKSTEP_RETURN_IF_ERROR(ledger_.Record(LedgerEventKind::kCompleted, id, wave.ranges));
  for (const std::string& part : wave.ids) report_.completed.push_back(part);
  return absl::OkStatus();
}

}  // namespace admission
}  // namespace lockstep
