// admission/recovery_loop.h
//
// RecoveryLoop: one training step's admission and out-of-memory recovery, the one loop that both
// RecoveringRunner (recovery.h: a step of forward and backward through the caller's callback) and
// TrainerRank (trainer/trainer_rank.h: forwards handed back one microbatch at a time) run. It owns
// the step's work as it is re-planned: the plan with its splits, each microbatch's stable id ("3",
// then "3.0" and "3.1" after a split, as the ledger names halves), the waves still to run, and the
// step's ledger record (ledger_step.h).
//
// One wave at a time (RunNext), pulled by the caller:
//   1. the wave is admitted under the cap (AdmitWaves' prediction) and its attempt runs this
//      member's part (AttemptHooks::attempt), its out-of-memory failure as kResourceExhausted;
//   2. the group agrees on the attempt's outcome (Note [Outcome agreement] in
//      collectives/outcome.h), so that every member takes the same path;
//   3. success on every member: AttemptHooks::on_success runs the part that needs every member
//      (a gather; committing staged gradients), and RunNext returns the wave;
//   4. out of memory on some member (and on none a failure of another kind), with a memory model:
//      every member runs AttemptHooks::on_failure (drops what the attempt left: staged gradients,
//      the RNG streams it advanced), releases cached memory, corrects the memory model and splits
//      the work the same way — a wave of several microbatches into two waves, a single
//      microbatch with planner::SplitMicrobatch (agreed across the group) — and retries, up to
//      `max_split_depth` halvings of one microbatch;
//   5. any other failure, or out of memory without a model: every member runs on_failure and the
//      step fails on every member: the failing member with its own error, the others with
//      kAborted naming it and its error. The loop is then finished.
// The ledger records, per attempt, admitted (with the prediction) and started (once the attempt's
// local part has returned, so that the record is off the path before it), then failed, split and
// retried as they happen; completed only when the caller says the wave's contribution counts
// (Complete: after the hand-back), and the step's commit (Commit).
//
// Contract:
// - Every member of the group runs the same waves in the same order and the same collectives
//   (the attempt's own collectives must be deterministic in the wave they are given); Begin checks
//   the group agrees on the plan, and every split is agreed.
// - Each token's contribution is counted once: what an attempt left is dropped through on_failure
//   before it is retried, and the ledger's schema refuses a token completed twice.
// - Errors name the step, the wave's ids and the attempt; a dead peer is the communicator's error
//   within its timeout.
//
// Thread-safety: one thread uses a RecoveryLoop at a time.
//
// Example:
//   RecoveryCollaborators collaborators = RecoveryCollaborators::Of(group);
//   collaborators.model = &model;
//   collaborators.cap_bytes = cap_bytes;
//   collaborators.ledger = ledger;
//   collaborators.writes = LedgerStep::Writes::kQueued;
//   LOCKSTEP_ASSIGN_OR_RETURN(RecoveryLoop loop,
//                             RecoveryLoop::Begin(collaborators, RecoveryOptions(), step, plan));
//   while (!loop.done()) {
//     LOCKSTEP_ASSIGN_OR_RETURN(WaveWork wave, loop.RunNext(hooks));
//     LOCKSTEP_RETURN_IF_ERROR(loop.Complete(wave));
//   }
//   LOCKSTEP_RETURN_IF_ERROR(loop.Commit());

#ifndef LOCKSTEP_ADMISSION_RECOVERY_LOOP_H_
#define LOCKSTEP_ADMISSION_RECOVERY_LOOP_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "admission/admission.h"
#include "admission/ledger.h"
#include "admission/ledger_step.h"
#include "admission/memory_model.h"
#include "admission/memory_probe.h"
#include "collectives/communicator.h"
#include "planner/plan.pb.h"

namespace lockstep {
namespace admission {

// One attempt at a wave, as the hooks see it.
struct WaveWork {
  // The training step.
  int64_t step = 0;
  // The step's plan as re-planned so far (splits replace microbatches); `microbatches` index it.
  // Valid until the loop's next RunNext.
  const planner::Plan* plan = nullptr;
  // Indices into *plan of the wave's microbatches, consecutive and ascending.
  std::vector<int> microbatches;
  // Stable ids of those microbatches: "3" for plan microbatch 3, "3.0" / "3.1" for its halves.
  std::vector<std::string> ids;
  // Input-sequence token ranges the wave covers.
  std::vector<TokenRange> ranges;
  // 1 for the first attempt at this work; retries after a split start again at 1 for the parts.
  int attempt = 1;
  // The model's prediction for the wave (0 without a model).
  double predicted_bytes = 0;
};

// The stages of an attempt the loop calls (see the top of this file). `attempt` is required; the
// others may be empty.
struct AttemptHooks {
  // This member's part of the attempt. Out of memory is kResourceExhausted (or a LibTorch
  // out-of-memory exception, mapped by the one LibTorch boundary).
  std::function<absl::Status(const WaveWork&)> attempt;
  // After every member's attempt succeeded. Its error fails the step (it is not retried).
  std::function<absl::Status(const WaveWork&)> on_success;
  // After the attempt failed on some member: drops what it left, on every member.
  std::function<void(const WaveWork&)> on_failure;
};

// Who the loop works with; all optional.
struct RecoveryCollaborators {
  // The members that must agree: the TP x CP group (nullptr or a group of one: this member alone).
  static RecoveryCollaborators Of(collectives::Communicator* group) {
    RecoveryCollaborators c;
    c.group = group;
    return c;
  }
  // The members that agree (Of); null: this member alone.
  collectives::Communicator* group = nullptr;
  // The memory model of admission and recovery: waves are admitted under `cap_bytes` by its
  // predictions and an out-of-memory attempt is split and retried. Default: null (every
  // microbatch is its own wave, and out of memory fails the step like any other failure).
  MemoryModel* model = nullptr;
  // The memory cap in bytes; > 0 with a model. Default: 0.
  int64_t cap_bytes = 0;
  // Peaks read after each successful attempt; cached memory released after out of memory.
  // Default: null (no readings, no cache release).
  MemoryProbe* probe = nullptr;
  // Where the step's events are recorded (ledger_step.h). Default: null (nothing is recorded).
  std::shared_ptr<Ledger> ledger;
  // How the ledger is written. Default: directly.
  LedgerStep::Writes writes = LedgerStep::Writes::kDirect;
};

// How the loop admits and recovers.
struct RecoveryOptions {
  // Most times one original microbatch may be halved (>= 0).
  int max_split_depth = 4;
  // How waves are formed (with a model). Default: AdmissionOptions().
  AdmissionOptions admission = AdmissionOptions();
};

// What a step's loop did.
struct StepReport {
  int64_t step = 0;                // the training step
  int waves_run = 0;               // waves that succeeded on every member
  int attempts = 0;                // attempts made, retries included
  int out_of_memory = 0;           // attempts that ran out of memory (on any member)
  int wave_splits = 0;             // waves halved into two waves after out of memory
  int microbatch_splits = 0;       // microbatches halved (planner::SplitMicrobatch)
  double max_predicted_bytes = 0;  // the largest prediction of any attempt, in bytes
  // Largest probe reading of a successful attempt (0 without a probe).
  int64_t max_measured_peak_bytes = 0;
  // Ids of the work that completed, in order.
  std::vector<std::string> completed;
  // The plan after all splits: filled by RecoveringRunner::RunStep (a RecoveryLoop's is plan()).
  planner::Plan final_plan;
};

// One step's waves, run one at a time by the caller with admission, agreement and recovery (see
// the top of this file).
class RecoveryLoop {
 public:
  // Begins step `step` over `plan`: admits its waves (with a model: kResourceExhausted naming a
  // microbatch that cannot fit), checks that the group agrees on the plan and the waves, and only
  // then begins the step in the ledger (a refused step leaves no trace there). kInvalidArgument,
  // naming it, for a non-positive cap with a model, a negative split depth or a plan without
  // microbatches.
  static absl::StatusOr<RecoveryLoop> Begin(const RecoveryCollaborators& collaborators,
                                            const RecoveryOptions& options, int64_t step,
                                            planner::Plan plan);

  // Moves the loop, its remaining waves and its ledger step; `other` must not be used after.
  RecoveryLoop(RecoveryLoop&&) = default;
  // As the move constructor.
  RecoveryLoop& operator=(RecoveryLoop&&) = default;
  RecoveryLoop(const RecoveryLoop&) = delete;
  RecoveryLoop& operator=(const RecoveryLoop&) = delete;

  // Whether every wave has run (or the loop failed).
  bool done() const { return failed_ || pending_.empty(); }

  // Runs the next wave until it succeeded on every member, recovering from out of memory, and
  // returns it. After an error the loop is finished (done()). Precondition: !done().
  absl::StatusOr<WaveWork> RunNext(const AttemptHooks& hooks);

  // Records `wave`'s microbatches as completed: their contribution counts.
  absl::Status Complete(const WaveWork& wave);

  // Commits the step in the ledger (OK without one).
  absl::Status Commit(std::string detail = "") { return ledger_.Commit(std::move(detail)); }

  // The step's plan after the splits so far.
  const planner::Plan& plan() const { return plan_; }
  // The stable ids of plan()'s microbatches, by index ("3", "3.0", "3.1", ...).
  const std::vector<std::string>& ids() const { return ids_; }
  // What the loop has done so far.
  const StepReport& report() const { return report_; }
  // The training step.
  int64_t step() const { return report_.step; }

 private:
  // Work waiting to run: ids of consecutive microbatches of the current plan.
  struct PendingWave {
    std::vector<std::string> ids;
    bool after_failure = false;  // replaces work that failed: its first attempt is a retry
  };

  RecoveryLoop(const RecoveryCollaborators& collaborators, const RecoveryOptions& options,
               planner::Plan plan, LedgerStep ledger)
      : c_(collaborators), options_(options), plan_(std::move(plan)), ledger_(std::move(ledger)) {}

  WaveWork Describe(const PendingWave& wave) const;
  // After an agreed out-of-memory outcome of `work`: splits it into the pending work.
  absl::Status Split(const WaveWork& work, const std::string& name);

  RecoveryCollaborators c_;
  RecoveryOptions options_;
  planner::Plan plan_;
  LedgerStep ledger_;
  std::vector<std::string> ids_;  // by microbatch of plan_
  std::deque<PendingWave> pending_;
  StepReport report_;
  bool failed_ = false;
};

}  // namespace admission
}  // namespace lockstep

#endif  // LOCKSTEP_ADMISSION_RECOVERY_LOOP_H_
