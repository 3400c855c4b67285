#include "admission/ledger_step.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "planner/planner.h"

namespace lockstep {
namespace admission {

std::vector<TokenRange> TokenRangesOf(const planner::Plan& plan, int microbatch) {
  const planner::Microbatch& m = plan.microbatches(microbatch);
  std::vector<TokenRange> ranges;
  ranges.reserve(m.batch_index_size());
  for (int k = 0; k < m.batch_index_size(); ++k) {
    const int64_t begin = planner::TokenBegin(m, k);
    ranges.push_back({m.batch_index(k), begin, begin + m.cu_seqlens(k + 1) - m.cu_seqlens(k)});
  }
  return ranges;
}

std::vector<PlannedMicrobatch> PlannedWorkOf(const planner::Plan& plan) {
  std::vector<PlannedMicrobatch> work;
  work.reserve(plan.microbatches_size());
  for (int m = 0; m < plan.microbatches_size(); ++m) {
    work.push_back(PlannedMicrobatch::Of(absl::StrCat(m), TokenRangesOf(plan, m)));
  }
  return work;
}

absl::StatusOr<LedgerStep> LedgerStep::Begin(std::shared_ptr<Ledger> ledger, int64_t step,
                                             const planner::Plan& plan, Writes writes) {
  if (ledger == nullptr) return None();
  const std::string where = absl::StrCat("beginning step ", step, " of ledger ", ledger->path());
  if (writes == Writes::kQueued) {
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(ledger->QueueBeginStep(step, PlannedWorkOf(plan)), where);
  } else {
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(ledger->BeginStep(step, PlannedWorkOf(plan)), where);
  }
  return LedgerStep(std::move(ledger), step, writes);
}

absl::Status LedgerStep::Record(LedgerEventKind kind, const std::string& id,
                                std::vector<TokenRange> ranges, std::string detail) {
  if (ledger_ == nullptr) return absl::OkStatus();
  LedgerEvent event = LedgerEvent::Of(kind, step_, id, std::move(ranges), std::move(detail));
  const absl::Status status = writes_ == Writes::kQueued ? ledger_->QueueRecord(std::move(event))
                                                         : ledger_->Record(event).status();
  return Annotate(status, absl::StrCat("recording ", LedgerEventKindName(kind), " of microbatch ",
                                       id, " of ledger step ", step_));
}

absl::Status LedgerStep::Commit(std::string detail) {
  if (ledger_ == nullptr) return absl::OkStatus();
  const absl::Status status = writes_ == Writes::kQueued
                                  ? ledger_->QueueCommitStep(step_, std::move(detail))
                                  : ledger_->CommitStep(step_, detail);
  return Annotate(status, absl::StrCat("committing ledger step ", step_));
}

}  // namespace admission
}  // namespace lockstep
