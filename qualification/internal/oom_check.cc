#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "admission/gradient_staging.h"
#include "admission/ledger.h"
#include "admission/ledger_step.h"
#include "admission/memory_model.h"
#include "admission/recovery.h"
#include "base/status_macros.h"
#include "base/temp_dir.h"
#include "base/torch_boundary.h"
#include "planner/planner.h"
#include "qualification/internal/checks.h"
#include "qualification/toy_objective.h"

namespace lockstep {
namespace qualification {
using collectives::Communicator;

namespace {

// A staging that never discards: the double-counted-retry negative control.
class KeepEverythingStaging : public admission::ContributionStaging {
 public:
  absl::Status Begin() override { return absl::OkStatus(); }
  absl::Status Commit() override { return absl::OkStatus(); }
  void Discard() override {}
};

// A staging whose commit replaces the accumulated gradient with the stage instead of adding to it:
// the staging-replaces negative control (every microbatch before the last one is lost).
class ReplacingStaging : public admission::ContributionStaging {
 public:
  explicit ReplacingStaging(at::Tensor weight) : weight_(std::move(weight)) {}
  absl::Status Begin() override {
    return CallTorch("staging", [&] {
      kept_ = weight_.grad().defined() ? weight_.grad().clone() : at::Tensor();
      if (weight_.grad().defined()) weight_.mutable_grad().zero_();
    });
  }
  absl::Status Commit() override { return absl::OkStatus(); }  // the bug: kept_ is dropped
  void Discard() override {
    CallTorch("discarding", [&] {
      if (kept_.defined()) weight_.mutable_grad() = kept_;
    }).IgnoreError();
  }

 private:
  at::Tensor weight_;
  at::Tensor kept_;
};

struct ToyStep {
  at::Tensor group_gradient;
  admission::StepReport report;
};

// One step of the toy objective over `plan` on this rank's CP shard, through the recovering
// runner; the victim replica fails its first `failures` attempts after their backward.
absl::StatusOr<ToyStep> RunToyStep(RankSetup& setup, const planner::Plan& plan, int failures,
                                   std::shared_ptr<admission::Ledger> ledger) {
  Communicator& group = *setup.groups.tp_cp();
  const collectives::Coordinates coordinates = setup.groups.coordinates();
  const int cp_rank = coordinates.cp;
  const bool victim = group.rank() == group.size() - 1;
  LOCKSTEP_ASSIGN_OR_RETURN(ToyObjective objective, ToyObjective::Create(5, 1));
  LOCKSTEP_ASSIGN_OR_RETURN(admission::MemoryModel model, admission::MemoryModel::Of(1000, 10));
  admission::GradientStaging gradient_staging(objective.parameters());
  KeepEverythingStaging keep_everything;
  ReplacingStaging replacing(objective.weight());
  admission::ContributionStaging* staging = &gradient_staging;
  if (setup.control == NegativeControl::kDoubleCountedRetry) staging = &keep_everything;
  if (setup.control == NegativeControl::kStagingReplaces) staging = &replacing;
  admission::RecoveryOptions options;
  options.admission.max_microbatches_per_wave = 1;
  auto collaborators = admission::RecoveringRunner::Collaborators::Of(&model, staging);
  collaborators.group = &group;
  collaborators.ledger = ledger;
  LOCKSTEP_ASSIGN_OR_RETURN(
      auto runner, admission::RecoveringRunner::Create(collaborators, int64_t{1} << 30, options));
  int failed = 0;
  ToyStep step;
  LOCKSTEP_ASSIGN_OR_RETURN(
      step.report, runner->RunStep(0, plan, [&](const admission::WaveWork& work) -> absl::Status {
        LOCKSTEP_RETURN_IF_ERROR(objective.RunWave(work, cp_rank));
        if (victim && failed < failures) {
          ++failed;
          return absl::ResourceExhaustedError("injected out of memory (qualify --inject_oom)");
        }
        return absl::OkStatus();
      }));
  LOCKSTEP_RETURN_IF_ERROR(runner->CommitStep(0));
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(
      "copying the gradient", [&] { step.group_gradient = objective.weight().grad().clone(); }));
  LOCKSTEP_RETURN_IF_ERROR(group.AllReduceSum(step.group_gradient));
  return step;
}

// The reference: the same microbatches' gradients accumulated plainly, one after the other,
// without the recovering runner, admission or any staging, so that no bug of theirs can cancel
// out in the comparison.
absl::StatusOr<at::Tensor> PlainGroupGradient(RankSetup& setup, const planner::Plan& plan) {
  const collectives::Coordinates coordinates = setup.groups.coordinates();
  LOCKSTEP_ASSIGN_OR_RETURN(ToyObjective objective, ToyObjective::Create(5, 1));
  for (int m = 0; m < plan.microbatches_size(); ++m) {
    admission::WaveWork work;
    work.plan = &plan;
    work.microbatches = {m};
    work.ids = {absl::StrCat(m)};
    work.ranges = admission::TokenRangesOf(plan, m);
    LOCKSTEP_RETURN_IF_ERROR(objective.RunWave(work, coordinates.cp));
  }
  at::Tensor gradient;
  LOCKSTEP_RETURN_IF_ERROR(
      CallTorch("copying the gradient", [&] { gradient = objective.weight().grad().clone(); }));
  LOCKSTEP_RETURN_IF_ERROR(setup.groups.tp_cp()->AllReduceSum(gradient));
  return gradient;
}

}  // namespace

absl::StatusOr<CheckResult> CheckOomRecovery(RankSetup& setup) {
  const int world_rank = setup.groups.world().rank();
  std::vector<planner::Sequence> batch;
  const int64_t lengths[] = {40, 12, 64, 7, 33, 50, 20, 9, 61, 3, 27, 64};
  for (int i = 0; i < 12; ++i) batch.push_back(planner::Sequence::Of(lengths[i], 100 + i));
  planner::PlanOptions plan_options;
  plan_options.max_tokens_per_microbatch = 64;
  plan_options.cp_size = setup.groups.topology().cp_size();
  LOCKSTEP_ASSIGN_OR_RETURN(planner::Plan plan, planner::PlanMicrobatches(batch, plan_options));

  LOCKSTEP_ASSIGN_OR_RETURN(const at::Tensor reference, PlainGroupGradient(setup, plan));
  // Without a ledger directory, the ledger goes into a directory of this rank's own (TempDir:
  // removed on every path).
  std::optional<TempDir> own_dir;
  if (setup.ledger_dir.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(own_dir, TempDir::Make(absl::StrCat("qualify_rank", world_rank)));
  }
  const std::string path = absl::StrCat(own_dir.has_value() ? own_dir->path() : setup.ledger_dir,
                                        "/ledger.rank", world_rank, ".db");
  admission::RemoveLedgerFiles(path);
  absl::StatusOr<ToyStep> injected;
  const collectives::Coordinates coordinates = setup.groups.coordinates();
  {
    LOCKSTEP_ASSIGN_OR_RETURN(
        std::shared_ptr<admission::Ledger> ledger,
        admission::Ledger::OpenWriter(path, admission::LedgerOptions::Of(coordinates.dp)));
    injected = RunToyStep(setup, plan, setup.inject_oom, ledger);
  }
  if (!injected.ok()) return injected.status();
  LOCKSTEP_ASSIGN_OR_RETURN(admission::LedgerReplay replay, admission::Ledger::Replay(path));
  double difference = 0;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("comparing gradients", [&] {
    difference = MaxRelativeDifference(injected->group_gradient, reference);
  }));
  std::vector<std::string> problems;
  const admission::StepReport& report = injected->report;
  if (setup.inject_oom < 1) {
    problems.push_back("no out-of-memory failure was injected: nothing was recovered");
  }
  if (report.out_of_memory != setup.inject_oom) {
    problems.push_back(absl::StrCat(report.out_of_memory, " out-of-memory outcomes seen, ",
                                    setup.inject_oom, " injected"));
  }
  if (!(difference <= 1e-6)) {
    problems.push_back(absl::StrFormat(
        "the group's gradient differs from the plain accumulation (no admission, no staging) by "
        "%.3g (relative; allowed 1e-6)",
        difference));
  }
  const admission::StepReplay* step = replay.steps.empty() ? nullptr : &replay.steps.front();
  if (step == nullptr || !step->committed || step->completed_tokens != plan.num_tokens() ||
      !step->missing.empty()) {
    problems.push_back("the ledger does not show every token counted once");
  }
  std::string summary = replay.Summary();
  const size_t line = summary.find('\n');
  summary = line == std::string::npos ? summary : summary.substr(line + 1);
  while (!summary.empty() && summary.back() == '\n') summary.pop_back();
  const std::string figures = absl::StrFormat(
      "%d injected on replica %d of the TP x CP group; %d split(s), %d attempts on every "
      "replica; gradient max rel diff %.3g vs the plain accumulation; ledger: %s",
      setup.inject_oom, setup.groups.tp_cp()->size() - 1, report.microbatch_splits, report.attempts,
      difference, summary);
  return CheckResult::Make(
      "oom_recovery", problems.empty(),
      problems.empty() ? figures : absl::StrCat(absl::StrJoin(problems, "; "), " (", figures, ")"));
}

}  // namespace qualification
}  // namespace lockstep
