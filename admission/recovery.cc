#include "admission/recovery.h"

#include <algorithm>
#include <deque>
#include <map>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "collectives/agreement.h"
#include "planner/planner.h"

namespace lockstep {
namespace admission {
namespace {

// Work waiting to run: ids of consecutive microbatches of the current plan.
struct PendingWave {
  std::vector<std::string> ids;
  // True when this work replaces work that failed (its first attempt is then a retry).
  bool after_failure = false;
};

int IndexOf(const std::vector<std::string>& ids, const std::string& id) {
  return static_cast<int>(std::find(ids.begin(), ids.end(), id) - ids.begin());
}

int SplitDepth(const std::string& id) {
  return static_cast<int>(std::count(id.begin(), id.end(), '.'));
}

}  // namespace

absl::StatusOr<GroupOutcome> AgreeOnOutcome(collectives::Communicator* group,
                                            const absl::Status& local) {
  GroupOutcome outcome;
  outcome.out_of_memory = absl::IsResourceExhausted(local) ? 1 : 0;
  outcome.failed = !local.ok() && outcome.out_of_memory == 0 ? 1 : 0;
  if (group == nullptr) return outcome;
  at::Tensor votes;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("outcome vote", [&] {
    votes = at::tensor(std::vector<int64_t>{outcome.out_of_memory, outcome.failed}, at::kLong);
  }));
  LOCKSTEP_RETURN_IF_ERROR(group->AllReduceSum(votes));
  outcome.out_of_memory = votes[0].item<int64_t>();
  outcome.failed = votes[1].item<int64_t>();
  return outcome;
}

std::vector<TokenRange> TokenRangesOf(const planner::Plan& plan, int microbatch) {
  const planner::Microbatch& m = plan.microbatches(microbatch);
  std::vector<TokenRange> ranges;
  for (int k = 0; k < m.batch_index_size(); ++k) {
    const int64_t begin = planner::TokenBegin(m, k);
    ranges.push_back({m.batch_index(k), begin, begin + m.cu_seqlens(k + 1) - m.cu_seqlens(k)});
  }
  return ranges;
}

std::vector<PlannedMicrobatch> PlannedWorkOf(const planner::Plan& plan) {
  std::vector<PlannedMicrobatch> work;
  for (int m = 0; m < plan.microbatches_size(); ++m) {
    work.push_back(PlannedMicrobatch::Of(absl::StrCat(m), TokenRangesOf(plan, m)));
  }
  return work;
}

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
  LOCKSTEP_ASSIGN_OR_RETURN(Admission admitted,
                            AdmitWaves(plan, *c_.model, cap_bytes_, options_.admission));
  StepReport report;
  report.step = step;
  report.final_plan = plan;
  planner::Plan& current = report.final_plan;
  std::vector<std::string> ids;
  for (int m = 0; m < plan.microbatches_size(); ++m) ids.push_back(absl::StrCat(m));
  if (c_.ledger != nullptr) {
    LOCKSTEP_RETURN_IF_ERROR(c_.ledger->BeginStep(step, PlannedWorkOf(plan)));
  }
  std::deque<PendingWave> pending;
  for (const Wave& wave : admitted.waves) {
    PendingWave p;
    for (int m : wave.microbatches) p.ids.push_back(ids[m]);
    pending.push_back(std::move(p));
  }
  auto record = [&](LedgerEventKind kind, const std::vector<std::string>& wave_ids,
                    std::vector<TokenRange> ranges, std::string detail) -> absl::Status {
    if (c_.ledger == nullptr) return absl::OkStatus();
    return c_.ledger
        ->Record(LedgerEvent::Of(kind, step, absl::StrJoin(wave_ids, "+"), std::move(ranges),
                                 std::move(detail)))
        .status();
  };

  while (!pending.empty()) {
    PendingWave wave = std::move(pending.front());
    pending.pop_front();
    WaveWork work;
    work.step = step;
    work.plan = &current;
    work.ids = wave.ids;
    WorkShape shape;
    for (const std::string& id : wave.ids) {
      const int index = IndexOf(ids, id);
      work.microbatches.push_back(index);
      const std::vector<TokenRange> ranges = TokenRangesOf(current, index);
      work.ranges.insert(work.ranges.end(), ranges.begin(), ranges.end());
      shape = shape + ShapeOfMicrobatch(current, index);
    }
    work.predicted_bytes = c_.model->Predict(shape);
    report.max_predicted_bytes = std::max(report.max_predicted_bytes, work.predicted_bytes);
    const std::string name =
        absl::StrCat("step ", step, ", wave ", absl::StrJoin(wave.ids, "+"), ", attempt 1");
    if (c_.group != nullptr) {
      LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
          collectives::CheckAgreement(*c_.group, "admission/wave",
                                      absl::StrCat(step, "/", absl::StrJoin(wave.ids, "+"))),
          name);
    }
    if (wave.after_failure) {
      LOCKSTEP_RETURN_IF_ERROR(record(LedgerEventKind::kRetried, wave.ids, work.ranges, ""));
    }
    LOCKSTEP_RETURN_IF_ERROR(record(LedgerEventKind::kAdmitted, wave.ids, work.ranges,
                                    absl::StrCat("predicted ", FormatBytes(work.predicted_bytes),
                                                 " of ", FormatBytes(cap_bytes_))));
    LOCKSTEP_RETURN_IF_ERROR(record(LedgerEventKind::kStarted, wave.ids, work.ranges, ""));

    // The attempt, with its contribution staged.
    ++report.attempts;
    if (c_.probe != nullptr) LOCKSTEP_RETURN_IF_ERROR(c_.probe->ResetPeak());
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(c_.staging->Begin(), name);
    absl::Status outcome;
    absl::Status thrown = CallTorch(name, [&] { outcome = run(work); });
    if (!thrown.ok()) outcome = thrown;
    const bool local_oom = absl::IsResourceExhausted(outcome);
    const bool local_error = !outcome.ok() && !local_oom;

    absl::StatusOr<GroupOutcome> agreed = AgreeOnOutcome(c_.group, outcome);
    if (!agreed.ok()) {
      c_.staging->Discard();
      return Annotate(agreed.status(), absl::StrCat(name, ": exchanging the attempt's outcome"));
    }
    const int64_t oom = agreed->out_of_memory, failed = agreed->failed;
    if (failed > 0) {
      c_.staging->Discard();
      record(LedgerEventKind::kFailed, wave.ids, work.ranges,
             local_error ? std::string(outcome.message()) : "a peer of the group failed")
          .IgnoreError();
      if (local_error) return Annotate(outcome, name);
      return absl::AbortedError(absl::StrCat(name, ": ", failed,
                                             " replica(s) of the TP x CP group failed it (not out "
                                             "of memory); every replica stops"));
    }
    if (oom > 0) {
      ++report.out_of_memory;
      c_.staging->Discard();
      LOCKSTEP_RETURN_IF_ERROR(
          record(LedgerEventKind::kFailed, wave.ids, work.ranges,
                 local_oom ? absl::StrCat("out of memory: ", outcome.message())
                           : absl::StrCat("out of memory on ", oom, " peer(s) of the group")));
      if (c_.probe != nullptr) {
        LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(c_.probe->ReleaseCachedMemory(), name);
      }
      c_.model->CorrectAfterOom(shape, cap_bytes_);
      if (wave.ids.size() > 1) {
        // A wave of several microbatches: run its halves as separate waves.
        ++report.wave_splits;
        const size_t half = wave.ids.size() / 2;
        PendingWave first{std::vector<std::string>(wave.ids.begin(), wave.ids.begin() + half),
                          true};
        PendingWave second{std::vector<std::string>(wave.ids.begin() + half, wave.ids.end()), true};
        LOCKSTEP_RETURN_IF_ERROR(record(LedgerEventKind::kSplit, wave.ids, work.ranges,
                                        absl::StrCat("wave into ", absl::StrJoin(first.ids, "+"),
                                                     " and ", absl::StrJoin(second.ids, "+"))));
        pending.push_front(std::move(second));
        pending.push_front(std::move(first));
        continue;
      }
      const std::string& id = wave.ids[0];
      if (SplitDepth(id) >= options_.max_split_depth) {
        return absl::ResourceExhaustedError(
            absl::StrCat(name, ": microbatch ", id, " ran out of memory after ", SplitDepth(id),
                         " splits (max_split_depth ", options_.max_split_depth, "); cap ",
                         FormatBytes(cap_bytes_)));
      }
      absl::StatusOr<planner::Plan> split = planner::SplitMicrobatch(current, work.microbatches[0]);
      if (!split.ok()) {
        return absl::ResourceExhaustedError(absl::StrCat(name, ": microbatch ", id,
                                                         " ran out of memory and cannot be split "
                                                         "further: ",
                                                         split.status().message()));
      }
      ++report.microbatch_splits;
      current = std::move(*split);
      const int at = work.microbatches[0];
      ids[at] = absl::StrCat(id, ".1");
      ids.insert(ids.begin() + at, absl::StrCat(id, ".0"));
      LOCKSTEP_RETURN_IF_ERROR(
          record(LedgerEventKind::kSplit, wave.ids, work.ranges,
                 absl::StrCat("microbatch into ", ids[at], " (",
                              current.microbatches(at).num_tokens(), " tokens) and ", ids[at + 1],
                              " (", current.microbatches(at + 1).num_tokens(), " tokens)")));
      if (c_.group != nullptr) {
        LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
            collectives::CheckAgreement(*c_.group, "admission/split",
                                        absl::StrCat(DigestHex(planner::PlanDigest(current)), "/",
                                                     absl::StrJoin(ids, ","))),
            absl::StrCat(name, ": agreeing on the split"));
      }
      pending.push_front(PendingWave{{ids[at + 1]}, true});
      pending.push_front(PendingWave{{ids[at]}, true});
      continue;
    }

    // Success on every replica: the contribution counts, once.
    if (c_.probe != nullptr) {
      absl::StatusOr<MemoryReading> reading = c_.probe->Read();
      if (reading.ok()) {
        report.max_measured_peak_bytes =
            std::max(report.max_measured_peak_bytes, reading->peak_allocated_bytes);
      }
    }
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(c_.staging->Commit(), name);
    LOCKSTEP_RETURN_IF_ERROR(record(LedgerEventKind::kCompleted, wave.ids, work.ranges, ""));
    ++report.waves_run;
    for (const std::string& id : wave.ids) report.completed.push_back(id);
  }
  return report;
}

absl::Status RecoveringRunner::CommitStep(int64_t step) {
  if (c_.ledger == nullptr) return absl::OkStatus();
  return c_.ledger->CommitStep(step);
}

}  // namespace admission
}  // namespace lockstep
