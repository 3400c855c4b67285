// admission/recovery.h
//
// The admission loop a trainer runs for one step: admit the plan's microbatches in waves under
// the cap, run each wave through the caller's callback, and record every attempt in the ledger.
// When a wave runs out of memory on any replica of the TP x CP group, every replica discards the
// wave's gradient contribution, releases cached memory, corrects the memory model and splits the
// work the same way (a wave of several microbatches into two waves; a single microbatch with
// planner::SplitMicrobatch — sequence boundaries first, then CP-compatible cuts), then retries,
// up to a split depth. Each token's contribution is counted exactly once.
//
// Contract:
// - Exactly once: the callback's contribution goes to a stage (ContributionStaging::Begin before
//   the attempt); it is committed only after the whole group agreed the attempt succeeded, and
//   discarded otherwise. The ledger (optional) records planned / admitted / started / completed /
//   failed / split / retried events; its schema refuses a token range completed twice.
// - Agreement: after every attempt the group exchanges its outcome (one all-reduce of two
//   integers), so a replica that ran out of memory makes all of them split, and a replica that
//   failed otherwise makes all of them stop (kAborted on the others, naming the wave). Before each
//   wave, and after each split, the group checks it agrees on the work (collectives agreement
//   check), so collectives inside the callback stay matched. A dead peer surfaces as the
//   communicator's error within its timeout, never a hang. No group: the rank decides alone.
// - Out of memory is kResourceExhausted from the callback, or a LibTorch out-of-memory exception
//   it throws (mapped through the one LibTorch boundary). A microbatch still out of memory at the
//   maximum split depth, or one that cannot be split further, fails the step with
//   kResourceExhausted naming it and its depth.
// - The callback must be deterministic in the collectives it calls: every replica runs the same
//   waves in the same order.
//
// Thread-safety: a RecoveringRunner is used by one thread at a time.
//
// Example:
//   GradientStaging staging(model->parameters());
//   LOCKSTEP_ASSIGN_OR_RETURN(auto runner, RecoveringRunner::Create(
//       RecoveringRunner::Collaborators::Of(&memory_model, &staging)
//           .WithProbe(&probe).WithGroup(tp_cp_group).WithLedger(ledger.get()),
//       cap_bytes, RecoveryOptions::Defaults()));
//   LOCKSTEP_ASSIGN_OR_RETURN(StepReport report, runner->RunStep(step, plan,
//       [&](const WaveWork& work) { return ForwardBackward(work); }));
//   optimizer.step();
//   LOCKSTEP_RETURN_IF_ERROR(runner->CommitStep(step));

#ifndef LOCKSTEP_ADMISSION_RECOVERY_H_
#define LOCKSTEP_ADMISSION_RECOVERY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "admission/admission.h"
#include "admission/ledger.h"
#include "admission/memory_model.h"
#include "admission/memory_probe.h"
#include "collectives/communicator.h"
#include "planner/plan.pb.h"

namespace lockstep {
namespace admission {

// Where an attempt's gradient contribution goes until the group agrees on its outcome.
class ContributionStaging {
 public:
  virtual ~ContributionStaging() = default;
  // Before an attempt: contributions from now on go to a fresh stage.
  virtual absl::Status Begin() = 0;
  // After an agreed success: the stage joins the accumulated contributions.
  virtual absl::Status Commit() = 0;
  // After a failure anywhere in the group: the stage is dropped.
  virtual void Discard() = 0;
};

// One attempt at a wave, as the callback sees it.
struct WaveWork {
  int64_t step = 0;
  // The step's plan as re-planned so far (splits replace microbatches); `microbatches` index it.
  const planner::Plan* plan = nullptr;
  std::vector<int> microbatches;
  // Stable ids of those microbatches: "3" for plan microbatch 3, "3.0" / "3.1" for its halves.
  std::vector<std::string> ids;
  // Input-sequence token ranges the wave covers.
  std::vector<TokenRange> ranges;
  // 1 for the first attempt at this work; retries after a split start again at 1 for the parts.
  int attempt = 1;
  // The model's prediction for the wave.
  double predicted_bytes = 0;
};

using RunWave = std::function<absl::Status(const WaveWork&)>;

struct RecoveryOptions {
  static RecoveryOptions Defaults() { return RecoveryOptions(); }
  // Most times one original microbatch may be halved (>= 0).
  int max_split_depth = 4;
  AdmissionOptions admission = AdmissionOptions::Defaults();
};

struct StepReport {
  int64_t step = 0;
  int waves_run = 0;
  int attempts = 0;
  int out_of_memory = 0;
  int wave_splits = 0;
  int microbatch_splits = 0;
  double max_predicted_bytes = 0;
  // Largest probe reading of a successful attempt (0 without a probe).
  int64_t max_measured_peak_bytes = 0;
  // Ids of the work that completed, in order.
  std::vector<std::string> completed;
  // The plan after all splits.
  planner::Plan final_plan;
};

// What the members of a group made of one attempt: how many ran out of memory and how many
// failed otherwise.
struct GroupOutcome {
  int64_t out_of_memory = 0;
  int64_t failed = 0;
};

// Exchanges `local` (this member's attempt: OK, kResourceExhausted for out of memory, anything
// else a failure) across `group` with one all-reduce of two integers, so that every member
// decides the same way; without a group, this member's own outcome. The communicator's error
// (a dead or late peer) is returned as it is.
absl::StatusOr<GroupOutcome> AgreeOnOutcome(collectives::Communicator* group,
                                            const absl::Status& local);

// The token ranges microbatch `microbatch` of `plan` holds.
std::vector<TokenRange> TokenRangesOf(const planner::Plan& plan, int microbatch);

// The ledger's view of a fresh plan: microbatch m as id "m" with its ranges.
std::vector<PlannedMicrobatch> PlannedWorkOf(const planner::Plan& plan);

class RecoveringRunner {
 public:
  // What the runner works with; model and staging are required, the rest optional.
  struct Collaborators {
    static Collaborators Of(MemoryModel* model, ContributionStaging* staging) {
      Collaborators c;
      c.model = model;
      c.staging = staging;
      return c;
    }
    Collaborators& WithProbe(MemoryProbe* p) {
      probe = p;
      return *this;
    }
    Collaborators& WithGroup(collectives::Communicator* g) {
      group = g;
      return *this;
    }
    Collaborators& WithLedger(Ledger* l) {
      ledger = l;
      return *this;
    }
    MemoryModel* model = nullptr;
    ContributionStaging* staging = nullptr;
    MemoryProbe* probe = nullptr;
    collectives::Communicator* group = nullptr;
    Ledger* ledger = nullptr;
  };

  // kInvalidArgument, naming it, for a missing model or staging, a non-positive cap or a negative
  // split depth. The collaborators must outlive the runner.
  static absl::StatusOr<std::unique_ptr<RecoveringRunner>> Create(
      const Collaborators& collaborators, int64_t cap_bytes, const RecoveryOptions& options);

  // Runs every token of `plan` once through `run`, recovering from out-of-memory as above.
  // Errors carry the step, the wave's ids and the attempt.
  absl::StatusOr<StepReport> RunStep(int64_t step, const planner::Plan& plan, const RunWave& run);

  // Records the step's commit in the ledger (after the caller's optimizer step); OK without one.
  absl::Status CommitStep(int64_t step);

  int64_t cap_bytes() const { return cap_bytes_; }

 private:
  RecoveringRunner(const Collaborators& c, int64_t cap, const RecoveryOptions& options)
      : c_(c), cap_bytes_(cap), options_(options) {}

  Collaborators c_;
  int64_t cap_bytes_;
  RecoveryOptions options_;
};

}  // namespace admission
}  // namespace lockstep

#endif  // LOCKSTEP_ADMISSION_RECOVERY_H_
