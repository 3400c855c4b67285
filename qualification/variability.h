// qualification/variability.h
//
// The variability checks: the question ART's investigation could not close — two actors loaded
// from the same source and state give different outputs and gradients, and within one actor warm
// passes differ — answered on the trainer's reference model (reference_model.h) run through
// TrainerRank on the rank's DP x TP x CP topology. Every check runs in deterministic mode (at
// least the settings DeterministicMode sets, recorded in each actor's execution context) and
// compares bit for bit; a tolerance is never relaxed to pass. The step they repeat: one forward
// over a fixed batch of token ids (no RNG in the inputs; dropout from the model stream), the
// caller's loss and one backward per microbatch, no optimizer update.
//
//   repeatability       the step cold, warm1 and warm2 (numerics/repeatability.h) from the same RNG
//                       state (caller, model stream and named streams restored before each pass):
//                       outputs and every gradient bit-identical; each pass is recorded module by
//                       module (numerics/divergence.h, parameters' incoming and accumulated
//                       gradients tapped), so a difference comes with its first divergence and,
//                       per parameter, whether it entered in a backward's contribution or in the
//                       accumulation.
//   actors              (RunActor, CompareActors) two actors — separate processes each loading
//                       the same saved state (SaveActorState: weights, Adam state and every RNG
//                       stream after one Adam step) — have equal inventories of weights and
//                       optimizer state, equal execution contexts (or the differing fields named)
//                       and bit-identical outputs and gradients of the step, else the first
//                       divergence between their recordings.
//   packing_invariance  every sequence of the batch computed in each placement lockstep may give
//                       it — alone, packed first-fit-decreasing under the memory cap of one actor
//                       and under the smaller cap of another, split by admission's out-of-memory
//                       recovery, and (CP > 1, TP 1) unsharded — has bit-identical outputs and
//                       loss contribution, or the first module whose result for that sequence
//                       depends on the placement is named with the figures; each placement is run
//                       twice, so that a placement-dependent op is told from nondeterminism.
//                       Dropout is off here (ReferenceModel::DisableDropout): this check is about
//                       numerics; the randomness's invariance is partition_invariance's.
//
// The negative control NegativeControl::kNondeterministicOp (the only one these checks plant;
// every other control leaves them as they are) breaks kNondeterministicModule
// (ReferenceModel::BreakDeterminismAt): repeatability, actors and packing_invariance fail naming
// it as the first divergence.
//
// Every call is collective over the world, every rank calling it with the same topology and
// options (CompareActors is not collective: it reads two files).

#ifndef LOCKSTEP_QUALIFICATION_VARIABILITY_H_
#define LOCKSTEP_QUALIFICATION_VARIABILITY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "c10/core/Device.h"
#include "collectives/communicator.h"
#include "collectives/topology.h"
#include "nlohmann/json.hpp"
#include "qualification/negative_controls.h"

namespace lockstep {
namespace qualification {

// The module kNondeterministicOp breaks: the last block's MLP, so that the modules before it
// show the localization does not just name the first module.
inline constexpr char kNondeterministicModule[] = "block1.mlp";

struct VariabilityCheck {
  std::string name;
  bool passed = false;
  std::string detail;
  // Every figure behind the verdict (the per-module comparisons in execution order, the first
  // divergence, the leaf-gradient verdicts, inventories and contexts), for the evidence JSON and
  // the report.
  nlohmann::json evidence;
};

// Switches LibTorch into deterministic mode for its lifetime and restores the previous settings
// after: deterministic algorithms (erroring, not warning), cuDNN deterministic and not
// benchmarking, TF32 off for cuBLAS and cuDNN. On CUDA, an older LibTorch also needs
// CUBLAS_WORKSPACE_CONFIG set before the process's first cuBLAS call: the caller's job
// (numerics::PrepareCublasForDeterminism, as qualify's workers call it). Neither copyable nor
// movable: it lives in one scope.
class DeterministicMode {
 public:
  DeterministicMode();
  ~DeterministicMode();
  DeterministicMode(const DeterministicMode&) = delete;
  DeterministicMode& operator=(const DeterministicMode&) = delete;

 private:
  bool algorithms_, warn_only_, cudnn_deterministic_, cudnn_benchmark_, tf32_cublas_, tf32_cudnn_;
};

class VariabilityRank {
 public:
  // Creates the rank's TP, CP and TP x CP groups. Collective.
  static absl::StatusOr<std::unique_ptr<VariabilityRank>> Create(
      collectives::Communicator& world, const collectives::Topology& topology,
      NegativeControl control, c10::Device device = c10::Device(c10::kCPU));
  ~VariabilityRank();

  absl::StatusOr<VariabilityCheck> Repeatability();

  // Trains one Adam step from the model's fixed initial state and saves this rank's state (weights,
  // Adam state, every RNG stream) under `dir`/rank<R>, `dir` shared by the world's ranks.
  absl::Status SaveActorState(const std::string& dir);

  // One actor: a fresh trainer loading the state SaveActorState saved under `state_dir`, its
  // inventory and execution context, and the step run once, recorded. Writes this rank's evidence
  // as `prefix`.rank<R>.json (inventory, context), .safetensors (outputs and gradients) and .rec
  // (the recording).
  absl::Status RunActor(const std::string& state_dir, const std::string& prefix);

  absl::StatusOr<VariabilityCheck> PackingInvariance();

 private:
  struct Groups;
  VariabilityRank(collectives::Communicator& world, const collectives::Topology& topology,
                  NegativeControl control, c10::Device device, std::unique_ptr<Groups> groups);

  collectives::Communicator& world_;
  const collectives::Topology& topology_;
  NegativeControl control_;
  c10::Device device_;
  std::unique_ptr<Groups> groups_;
};

// The actors check of rank `rank` from the evidence RunActor wrote under `prefix_a` and
// `prefix_b`. An error only when a file is missing or malformed.
absl::StatusOr<VariabilityCheck> CompareActors(const std::string& prefix_a,
                                               const std::string& prefix_b, int rank);

}  // namespace qualification
}  // namespace lockstep

#endif  // LOCKSTEP_QUALIFICATION_VARIABILITY_H_
