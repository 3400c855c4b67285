// admission/ledger_step.h
//
// One training step's part of a recovery ledger (ledger.h), as a recovery loop writes it: the
// step's plan when it begins, each attempt's events under the microbatch ids the loop gives them
// ("3" for plan microbatch 3, "3.0" and "3.1" for its halves after a split, "3+4" for a wave of
// two), and the commit. The writes are direct (each returns once written) or queued (Note [Queued
// ledger writes] in ledger.h: written in order by the ledger's writer thread, off the caller's
// path). Without a ledger every call is a no-op, so the loop needs no second path.
//
// Also the conversion of a plan into what the ledger records: token ranges of the caller's
// sequences.
//
// Thread-safety: as the ledger's (one thread at a time).
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(LedgerStep recorder,
//                             LedgerStep::Begin(ledger, 7, plan, LedgerStep::Writes::kQueued));
//   LOCKSTEP_RETURN_IF_ERROR(recorder.Record(LedgerEventKind::kStarted, "0",
//                                            TokenRangesOf(plan, 0)));
//   ...
//   LOCKSTEP_RETURN_IF_ERROR(recorder.Commit());

#ifndef LOCKSTEP_ADMISSION_LEDGER_STEP_H_
#define LOCKSTEP_ADMISSION_LEDGER_STEP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "admission/ledger.h"
#include "planner/plan.pb.h"

namespace lockstep {
namespace admission {

// The caller's token ranges that microbatch `microbatch` of `plan` holds (one per packed
// sequence). Precondition: `microbatch` is in range.
std::vector<TokenRange> TokenRangesOf(const planner::Plan& plan, int microbatch);

// The ledger's view of a fresh plan: microbatch m as id "m" with its ranges.
std::vector<PlannedMicrobatch> PlannedWorkOf(const planner::Plan& plan);

// One step's writes to a ledger, or to none (see the top of this file).
class LedgerStep {
 public:
  // How the step's writes reach the ledger.
  enum class Writes {
    kDirect,  // Ledger::BeginStep, Record, CommitStep
    kQueued,  // Ledger::QueueBeginStep, QueueRecord, QueueCommitStep
  };

  // A step that records nothing (no ledger).
  static LedgerStep None() { return LedgerStep(nullptr, -1, Writes::kDirect); }

  // Begins step `step` of `ledger` with `plan`'s microbatches as planned. With a null ledger, a
  // step that records nothing. Errors name the ledger and the step (the ledger's refusals: a step
  // already begun, one not after the last committed, an open step).
  static absl::StatusOr<LedgerStep> Begin(std::shared_ptr<Ledger> ledger, int64_t step,
                                          const planner::Plan& plan, Writes writes);

  // Records an event of microbatch (or wave) `id` of this step.
  absl::Status Record(LedgerEventKind kind, const std::string& id, std::vector<TokenRange> ranges,
                      std::string detail = "");

  // Commits the step (after its last microbatch completed).
  absl::Status Commit(std::string detail = "");

  // Whether there is a ledger to write to (false: every call is a no-op).
  bool recording() const { return ledger_ != nullptr; }
  // The step being recorded (-1 for None()).
  int64_t step() const { return step_; }

 private:
  LedgerStep(std::shared_ptr<Ledger> ledger, int64_t step, Writes writes)
      : ledger_(std::move(ledger)), step_(step), writes_(writes) {}

  std::shared_ptr<Ledger> ledger_;
  int64_t step_;
  Writes writes_;
};

}  // namespace admission
}  // namespace lockstep

#endif  // LOCKSTEP_ADMISSION_LEDGER_STEP_H_
