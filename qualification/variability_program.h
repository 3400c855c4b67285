// qualification/variability_program.h
//
// Internal to the variability checks (variability.h): the training program they repeat — the
// reference model through a TrainerRank, a fixed linear head, Adam — built for one placement
// (token budget, packing, admission with an injected out-of-memory failure, sharded over the
// rank's TP x CP group or unsharded), the fixed batch it runs, and the step.
//
// Thread-safety: one thread at a time; the groups outlive the program.

#ifndef LOCKSTEP_QUALIFICATION_VARIABILITY_PROGRAM_H_
#define LOCKSTEP_QUALIFICATION_VARIABILITY_PROGRAM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "c10/core/Device.h"
#include "collectives/communicator.h"
#include "collectives/topology.h"
#include "invariant/exact_gradients.h"
#include "numerics/named_tensors.h"
#include "qualification/reference_model.h"
#include "rng/rank_streams.h"
#include "torch/optim/adam.h"
#include "trainer/trainer_rank.h"

namespace lockstep {
namespace qualification {
namespace variability {

// Who runs the program: the rank's place in its topology and its groups (nullptr where the
// topology has no such group).
struct ProgramGroups {
  const collectives::Topology* topology = nullptr;
  int world_rank = 0;
  int dp_index = 0;
  int tp_rank = 0;
  std::shared_ptr<collectives::Communicator> tp_cp;
  collectives::Communicator* tp = nullptr;
  collectives::Communicator* cp = nullptr;
  c10::Device device = c10::Device(c10::kCPU);
};

struct Placement {
  std::string name;
  int64_t budget = 24;  // tokens per microbatch: the actor's memory cap
  planner::PackingPolicy packing = planner::PACKING_FIRST_FIT_DECREASING;
  planner::LossNormalization loss_normalization = planner::LOSS_TOKEN_MEAN;
  bool dropout = true;
  // Admission on, and the first forward of a microbatch of two or more sequences runs out of
  // memory (once), so recovery splits it.
  bool inject_oom = false;
  // Run as a world of one (TP 1 x CP 1) in this process, whatever the rank's topology.
  bool unsharded = false;
  std::string broken_module;        // ReferenceModel::BreakDeterminismAt, when not empty
  bool libtorch_attention = false;  // ReferenceModel::UseLibTorchAttention
  // Under placement-invariant mode: the parameters' gradients summed exactly (Program::exact)
  // instead of into .grad; FinishGradients writes them.
  bool exact_gradients = false;
};

struct Program {
  std::shared_ptr<rng::RankStreams> streams;
  std::unique_ptr<ReferenceModel> model;
  std::unique_ptr<trainer::TrainerRank> trainer;
  // The model's parameters, then the head ("head").
  numerics::NamedTensors parameters;
  std::unique_ptr<torch::optim::Adam> adam;
  int ooms_injected = 0;
  // With Placement::exact_gradients under the mode: the parameters' exact gradient sums.
  std::shared_ptr<invariant::ExactGradients> exact;
};

// A fresh program on `groups` (seeded 2000 + the world rank before TrainerRank::Create
// synchronizes the group). Collective over the TP x CP group unless `placement.unsharded`.
absl::StatusOr<std::unique_ptr<Program>> MakeProgram(const ProgramGroups& groups,
                                                     const Placement& placement);

// The DP worker's fixed batch: lengths {13, 7, 21, 5, 9}, token ids a fixed function of the
// position and the DP index (no RNG).
trainer::TrainerInputs FixedBatch(int dp_index);
// The sequences' first rows in FixedBatch's rows, and one past the last.
std::vector<int64_t> SequenceOffsets(const trainer::TrainerInputs& inputs);

struct StepResult {
  // "mb<m>.outputs" and "mb<m>.loss" per microbatch.
  numerics::NamedTensors outputs;
  std::vector<trainer::MicrobatchOutput> microbatches;
};

// One forward of `inputs` through ForwardAllMicrobatches and, with `backward`, the caller's loss
// (sum of weight x (head . output)^2) and one backward per microbatch; no optimizer step.
absl::StatusOr<StepResult> Step(Program& program, trainer::TrainerInputs inputs,
                                bool backward = true);

// The loss head's scores of `outputs` [rows, width]: [rows, 1]. With `invariant`, the mode's
// product (its gradient into program.exact's "head" slot when the program has exact sums);
// otherwise LibTorch's.
absl::StatusOr<at::Tensor> HeadScores(const Program& program, const at::Tensor& outputs,
                                      bool invariant);

// With program.exact: the exact gradient sums of every Step since the last call, summed over
// `group` (null: none), written to the parameters' .grad (replacing it). Otherwise nothing.
absl::Status FinishGradients(Program& program, collectives::Communicator* group);

}  // namespace variability
}  // namespace qualification
}  // namespace lockstep

#endif  // LOCKSTEP_QUALIFICATION_VARIABILITY_PROGRAM_H_
