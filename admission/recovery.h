// admission/recovery.h
//
// A training step of forward and backward with admission and out-of-memory recovery: the plan's
// microbatches admitted in waves under the cap, each wave run through the caller's callback (its
// forward and backward), every attempt recorded in the ledger. The loop itself — admission, the
// group's agreement on each attempt, the split and retry after out of memory on any replica, the
// ledger's events — is RecoveryLoop (recovery_loop.h), the same loop TrainerRank runs; this class
// adds the gradient staging that makes a failed attempt's partial contribution disappear.
//
// Contract:
// - Exactly once: the callback's contribution goes to a stage (ContributionStaging::Begin before
//   the attempt); it is committed only after the whole group agreed the attempt succeeded, and
//   discarded otherwise. The ledger (optional) records planned / admitted / started / completed /
//   failed / split / retried events; its schema refuses a token range completed twice.
// - Agreement (Note [Outcome agreement] in collectives/outcome.h): after every attempt the group
//   exchanges its outcome, so a replica that ran out of memory makes all of them split, and a
//   replica that failed otherwise makes all of them stop (kAborted on the others, naming the
//   failing rank and its error). The group agrees on the plan and the waves when the step
//   begins, and on every split, so collectives inside the callback stay matched. A dead peer
//   surfaces as the communicator's error within its timeout, never a hang. No group: the rank
//   decides alone.
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
//   auto collaborators = RecoveringRunner::Collaborators::Of(&memory_model, &staging);
//   collaborators.probe = &probe;
//   collaborators.group = tp_cp_group;
//   collaborators.ledger = ledger;
//   LOCKSTEP_ASSIGN_OR_RETURN(auto runner, RecoveringRunner::Create(
//       collaborators, cap_bytes, RecoveryOptions()));
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
#include "admission/recovery_loop.h"
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

// The caller's callback: runs one attempt at a wave (its forward and backward). Out of memory is
// kResourceExhausted or a LibTorch out-of-memory exception; any other error stops the step.
using RunWave = std::function<absl::Status(const WaveWork&)>;

// A training step's forward and backward with admission, out-of-memory recovery and gradient
// staging (see the top of this file).
class RecoveringRunner {
 public:
  // What the runner works with; model and staging are required, the rest optional.
  struct Collaborators {
    // The required collaborators: the memory model (corrected after out of memory) and the
    // staging of contributions.
    static Collaborators Of(MemoryModel* model, ContributionStaging* staging) {
      Collaborators c;
      c.model = model;
      c.staging = staging;
      return c;
    }
    // Predicts each wave; its safety factor is raised after out of memory. Required.
    MemoryModel* model = nullptr;
    // Where each attempt's contribution is staged. Required.
    ContributionStaging* staging = nullptr;
    // Peaks are reset before and read after each attempt, and cached memory released after out
    // of memory. Optional.
    MemoryProbe* probe = nullptr;
    // The TP x CP group that agrees on waves, outcomes and splits. Optional: without one the
    // rank decides alone.
    collectives::Communicator* group = nullptr;
    // Where every attempt is recorded. Optional.
    std::shared_ptr<Ledger> ledger;
  };

  // kInvalidArgument, naming it, for a missing model or staging, a non-positive cap or a negative
  // split depth. The collaborators must outlive the runner.
  static absl::StatusOr<std::unique_ptr<RecoveringRunner>> Create(
      const Collaborators& collaborators, int64_t cap_bytes, const RecoveryOptions& options);

  // Runs every token of `plan` once through `run`, recovering from out-of-memory as above;
  // the report's final_plan is the plan after every split. Errors carry the step, the wave's ids
  // and the attempt.
  absl::StatusOr<StepReport> RunStep(int64_t step, const planner::Plan& plan, const RunWave& run);

  // Records the step's commit in the ledger (after the caller's optimizer step); OK without one.
  absl::Status CommitStep(int64_t step);

  // The memory cap waves are admitted under, in bytes (as given to Create).
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
