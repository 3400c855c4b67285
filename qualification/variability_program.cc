#include "qualification/variability_program.h"

#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "admission/memory_model.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "c10/util/Exception.h"
#include "invariant/mode.h"
#include "invariant/ops.h"

namespace lockstep {
namespace qualification {
namespace variability {

absl::StatusOr<std::unique_ptr<Program>> MakeProgram(const ProgramGroups& groups,
                                                     const Placement& placement) {
  auto program = std::make_unique<Program>();
  const c10::Device device = groups.device;
  LOCKSTEP_ASSIGN_OR_RETURN(
      program->streams,
      rng::RankStreams::Create(device.is_cuda()
                                   ? rng::DefaultGenerators::WithCudaDevice(device.index())
                                   : rng::DefaultGenerators::CpuOnly()));
  LOCKSTEP_RETURN_IF_ERROR(
      CallTorch("seeding", [&] { at::manual_seed(2000 + groups.world_rank); }));
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::Topology alone,
                            collectives::Topology::CreateExact(1, 1, 1, 1));
  const collectives::Topology& topology = placement.unsharded ? alone : *groups.topology;
  const int tp_size = topology.tp_size();
  LOCKSTEP_ASSIGN_OR_RETURN(
      ReferenceModel model,
      ReferenceModel::Create(placement.unsharded ? 0 : groups.tp_rank, tp_size,
                             placement.unsharded ? nullptr : groups.tp,
                             placement.unsharded ? nullptr : groups.cp, device));
  program->model = std::make_unique<ReferenceModel>(std::move(model));
  if (!placement.dropout) program->model->DisableDropout();
  if (!placement.broken_module.empty()) {
    LOCKSTEP_RETURN_IF_ERROR(program->model->BreakDeterminismAt(placement.broken_module));
  }
  if (placement.libtorch_attention) program->model->UseLibTorchAttention();

  trainer::TrainerConfig config = trainer::TrainerConfig::Of(placement.budget);
  config.plan.packing = placement.packing;
  config.plan.loss_normalization = placement.loss_normalization;
  if (placement.inject_oom) {
    LOCKSTEP_ASSIGN_OR_RETURN(config.memory_model, admission::MemoryModel::Of(1e3, 1e2));
    config.memory_cap_bytes = int64_t{1} << 40;
  }
  ReferenceModel* raw_model = program->model.get();
  Program* raw_program = program.get();
  const bool inject_oom = placement.inject_oom;
  LOCKSTEP_ASSIGN_OR_RETURN(
      program->trainer,
      trainer::TrainerRank::Create(
          config,
          trainer::TrainerRank::Collaborators::Of(
              topology, placement.unsharded ? 0 : groups.world_rank,
              placement.unsharded ? nullptr : groups.tp_cp, program->streams),
          [raw_model, raw_program,
           inject_oom](const trainer::ShardWork& work) -> absl::StatusOr<at::Tensor> {
            // Every replica sees the same plan, so every one of them fails this
            // attempt.
            if (inject_oom && raw_program->ooms_injected == 0 &&
                work.plan->microbatches(work.microbatch).batch_index_size() >= 2) {
              ++raw_program->ooms_injected;
              throw c10::OutOfMemoryError({__func__, __FILE__, __LINE__},
                                          "injected out of memory (packing_invariance)");
            }
            return raw_model->Forward(work);
          }));
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  LOCKSTEP_ASSIGN_OR_RETURN(
      numerics::NamedTensors head,
      program->trainer->RegisterCustomObject(
          "loss_head", "linear 8 -> 1, no bias, fixed",
          [&f32]() -> absl::StatusOr<numerics::NamedTensors> {
            at::Tensor w;
            LOCKSTEP_RETURN_IF_ERROR(CallTorch("head", [&] {
              w = (0.3 * at::sin(at::arange(ReferenceModel::kWidth, f32) * 1.3 + 0.4))
                      .unsqueeze(0)
                      .set_requires_grad(true);
            }));
            return numerics::NamedTensors{{"w", w}};
          }));
  program->parameters = program->model->parameters();
  program->parameters.emplace_back("head", head[0].second);
  if (placement.exact_gradients && invariant::ModeOn()) {
    program->exact = std::make_shared<invariant::ExactGradients>(program->parameters);
    program->model->SetExactGradients(program->exact);
  }
  std::vector<at::Tensor> tensors;
  for (const auto& [name, tensor] : program->parameters) tensors.push_back(tensor);
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("creating Adam", [&] {
    program->adam = std::make_unique<torch::optim::Adam>(tensors, torch::optim::AdamOptions(0.05));
  }));
  return program;
}

trainer::TrainerInputs FixedBatch(int dp_index) {
  const int64_t lengths[] = {13, 7, 21, 5, 9};
  std::vector<planner::Sequence> sequences;
  int64_t tokens = 0;
  for (int i = 0; i < 5; ++i) {
    sequences.push_back(planner::Sequence::Of(lengths[i], 500 + 100 * dp_index + i));
    tokens += lengths[i];
  }
  at::Tensor rows =
      (at::arange(tokens, at::kLong) * 17 + 5 * dp_index + 3) % ReferenceModel::kVocab;
  return trainer::TrainerInputs::Of(std::move(sequences), rows);
}

std::vector<int64_t> SequenceOffsets(const trainer::TrainerInputs& inputs) {
  std::vector<int64_t> offsets = {0};
  for (const planner::Sequence& s : inputs.sequences)
    offsets.push_back(offsets.back() + s.num_tokens);
  return offsets;
}

absl::StatusOr<StepResult> Step(Program& program, trainer::TrainerInputs inputs, bool backward) {
  StepResult result;
  LOCKSTEP_ASSIGN_OR_RETURN(result.microbatches,
                            program.trainer->ForwardAllMicrobatches(std::move(inputs)));
  for (const trainer::MicrobatchOutput& out : result.microbatches) {
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("the caller's loss and backward", [&] {
      // With exact sums the head's gradient is summed exactly too.
      absl::StatusOr<at::Tensor> scores =
          HeadScores(program, out.outputs, /*invariant=*/program.exact != nullptr);
      if (!scores.ok()) ThrowAsTorchError(scores.status());
      const at::Tensor z = scores->squeeze(1);
      const at::Tensor loss = (out.loss_weights.to(z.options()) * z * z).sum();
      if (backward) loss.backward();
      result.outputs.emplace_back(absl::StrCat("mb", out.microbatch, ".outputs"),
                                  out.outputs.detach().clone());
      result.outputs.emplace_back(absl::StrCat("mb", out.microbatch, ".loss"),
                                  loss.detach().clone());
    }));
  }
  return result;
}

absl::StatusOr<at::Tensor> HeadScores(const Program& program, const at::Tensor& outputs,
                                      bool invariant) {
  const at::Tensor& head = program.parameters.back().second;
  if (!invariant) {
    return CallTorch("the head's scores",
                     [&]() -> absl::StatusOr<at::Tensor> { return at::mm(outputs, head.t()); });
  }
  invariant::WeightGradient to;
  if (program.exact != nullptr) {
    LOCKSTEP_ASSIGN_OR_RETURN(const int slot, program.exact->SlotOf("head"));
    to = {program.exact.get(), slot};
  }
  return invariant::Linear(outputs, head, to);
}

absl::Status FinishGradients(Program& program, collectives::Communicator* group) {
  if (program.exact == nullptr) return absl::OkStatus();
  // The head's input is the whole microbatch's gathered outputs on every member: its sums are
  // complete everywhere already.
  LOCKSTEP_RETURN_IF_ERROR(program.exact->SumOver(group, {"head"}));
  return program.exact->WriteGradients();
}

}  // namespace variability
}  // namespace qualification
}  // namespace lockstep
