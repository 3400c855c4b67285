#include "qualification/variability.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file_io.h"
#include "base/json.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "numerics/compare.h"
#include "numerics/divergence.h"
#include "numerics/execution_context.h"
#include "numerics/inventory.h"
#include "numerics/module_state.h"
#include "numerics/repeatability.h"
#include "numerics/safetensors.h"
#include "numerics/variability_evidence.h"
#include "qualification/variability_internal.h"
#include "qualification/variability_program.h"
#include "rng/resume_state.h"
#include "torch/nn/module.h"

namespace lockstep {
namespace qualification {

using collectives::Communicator;
using collectives::Topology;
using nlohmann::json;
using variability::Placement;
using variability::Program;

DeterministicMode::DeterministicMode() {
  at::Context& context = at::globalContext();
  algorithms_ = context.deterministicAlgorithms();
  warn_only_ = context.deterministicAlgorithmsWarnOnly();
  cudnn_deterministic_ = context.deterministicCuDNN();
  cudnn_benchmark_ = context.benchmarkCuDNN();
  tf32_cublas_ = context.allowTF32CuBLAS();
  tf32_cudnn_ = context.allowTF32CuDNN();
  context.setDeterministicAlgorithms(true, false);
  context.setDeterministicCuDNN(true);
  context.setBenchmarkCuDNN(false);
  context.setAllowTF32CuBLAS(false);
  context.setAllowTF32CuDNN(false);
}

DeterministicMode::~DeterministicMode() {
  at::Context& context = at::globalContext();
  context.setDeterministicAlgorithms(algorithms_, warn_only_);
  context.setDeterministicCuDNN(cudnn_deterministic_);
  context.setBenchmarkCuDNN(cudnn_benchmark_);
  context.setAllowTF32CuBLAS(tf32_cublas_);
  context.setAllowTF32CuDNN(tf32_cudnn_);
}

VariabilityRank::VariabilityRank(Communicator& world, const Topology& topology,
                                 NegativeControl control, c10::Device device,
                                 std::unique_ptr<Groups> groups)
    : world_(world),
      topology_(topology),
      control_(control),
      device_(device),
      groups_(std::move(groups)) {}

VariabilityRank::~VariabilityRank() = default;

absl::StatusOr<std::unique_ptr<VariabilityRank>> VariabilityRank::Create(Communicator& world,
                                                                         const Topology& topology,
                                                                         NegativeControl control,
                                                                         c10::Device device) {
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::RankGroups made,
                            collectives::RankGroups::CreateBorrowing(world, topology));
  auto groups = std::make_unique<Groups>(std::move(made));
  const collectives::RankGroups& rank = groups->rank;
  groups->program.topology = &topology;
  groups->program.world_rank = rank.rank();
  groups->program.dp_index = rank.coordinates().dp;
  groups->program.tp_rank = rank.coordinates().tp;
  groups->program.tp_cp = rank.tp_cp();
  groups->program.tp = rank.tp_or_null();
  groups->program.cp = rank.cp_or_null();
  groups->program.device = device;
  return std::unique_ptr<VariabilityRank>(
      new VariabilityRank(world, topology, control, device, std::move(groups)));
}

namespace variability {

namespace {

// Feeds the model's module taps to a numerics::Recorder.
class RecorderTaps : public ModuleTaps {
 public:
  explicit RecorderTaps(numerics::Recorder* recorder) : recorder_(recorder) {}
  at::Tensor Enter(const std::string& module, const at::Tensor& input) override {
    return recorder_->Enter(module, input);
  }
  at::Tensor Exit(const std::string& module, const at::Tensor& output, const at::Tensor&,
                  const at::Tensor&) override {
    return recorder_->Exit(module, output);
  }

 private:
  numerics::Recorder* recorder_;
};

// The model is small: every record keeps its tensor, so any divergence has its full figures.
constexpr int kKeepEveryTensor = 1 << 20;

}  // namespace

Placement StepPlacement(NegativeControl control) {
  Placement placement;
  placement.name = "step";
  if (control == NegativeControl::kNondeterministicOp) {
    placement.broken_module = kNondeterministicModule;
  }
  return placement;
}

absl::StatusOr<numerics::NamedTensors> RecordedStep(Program& program, int dp_index,
                                                    numerics::Recording& recording) {
  numerics::RecorderOptions options;
  options.keep_full_tensors = kKeepEveryTensor;
  numerics::Recorder recorder(options);
  program.model->SetTaps(std::make_shared<RecorderTaps>(&recorder));
  std::vector<numerics::ParameterTap> taps;
  for (const auto& [name, tensor] : program.parameters) {
    LOCKSTEP_ASSIGN_OR_RETURN(numerics::ParameterTap tap, recorder.TapParameter(name, tensor));
    taps.push_back(std::move(tap));
  }
  absl::StatusOr<StepResult> step = Step(program, FixedBatch(dp_index));
  program.model->SetTaps(nullptr);
  LOCKSTEP_RETURN_IF_ERROR(step.status());
  for (const auto& [name, tensor] : program.parameters) {
    if (tensor.grad().defined()) {
      LOCKSTEP_RETURN_IF_ERROR(recorder.RecordAccumulated(name, tensor));
    }
  }
  LOCKSTEP_RETURN_IF_ERROR(recorder.status());
  recording = recorder.Snapshot();
  return std::move(step->outputs);
}

}  // namespace variability

absl::StatusOr<VariabilityCheck> VariabilityRank::Repeatability() {
  DeterministicMode deterministic;
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::unique_ptr<Program> program,
      variability::MakeProgram(groups_->program, variability::StepPlacement(control_)));
  LOCKSTEP_ASSIGN_OR_RETURN(rng::RngResumeStateProto start,
                            rng::CaptureResumeState(*program->streams));
  std::vector<numerics::Recording> passes;
  const int dp_index = groups_->program.dp_index;
  auto step = [&]() -> absl::StatusOr<numerics::NamedTensors> {
    // The harness restores the default generators; the model stream and the named streams are
    // the rank's, restored here.
    if (control_ != NegativeControl::kRepeatabilityStreamNotRestored) {
      LOCKSTEP_RETURN_IF_ERROR(rng::RestoreResumeState(start, *program->streams));
    }
    numerics::Recording recording({});
    LOCKSTEP_ASSIGN_OR_RETURN(numerics::NamedTensors outputs,
                              variability::RecordedStep(*program, dp_index, recording));
    passes.push_back(std::move(recording));
    return outputs;
  };
  LOCKSTEP_ASSIGN_OR_RETURN(
      numerics::RepeatabilityReport report,
      numerics::RunRepeatability(step, program->parameters, numerics::Tolerance::Bitwise()));
  if (passes.size() != 3) {
    return absl::InternalError(absl::StrCat("the harness ran ", passes.size(), " passes, not 3"));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(
      numerics::VerdictEvidence verdict,
      numerics::RepeatabilityEvidence(report, passes, numerics::Tolerance::Bitwise()));
  VariabilityCheck check;
  check.name = "repeatability";
  check.passed = verdict.passed;
  check.detail = absl::StrCat("in deterministic mode, ", verdict.detail);
  check.evidence = std::move(verdict.evidence);
  return check;
}

namespace {

// The saved inventory is small (names and digests); far below this.
constexpr size_t kMaxActorEvidenceBytes = size_t{256} << 20;

// What an actor holds: its weights and its optimizer's state (the parameters belong to no
// torch::nn::Module, so the optimizer's entries are named by group and index).
absl::StatusOr<numerics::Inventory> ActorInventory(Program& program) {
  numerics::NamedTensors state;
  for (const auto& [name, tensor] : program.parameters)
    state.emplace_back("weight/" + name, tensor);
  torch::nn::Module none;
  LOCKSTEP_ASSIGN_OR_RETURN(numerics::NamedTensors optimizer,
                            numerics::ModuleState(none, program.adam.get()));
  for (auto& entry : optimizer) state.push_back(std::move(entry));
  return numerics::Inventory::Of(state);
}

// Where SaveActorState writes the inventory of what rank `rank` saved.
std::string SavedInventoryPath(const std::string& dir, int rank) {
  return absl::StrCat(dir, "/rank", rank, ".inventory.json");
}

}  // namespace

absl::Status VariabilityRank::SaveActorState(const std::string& dir) {
  DeterministicMode deterministic;
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::unique_ptr<Program> program,
      variability::MakeProgram(groups_->program, variability::StepPlacement(control_)));
  LOCKSTEP_RETURN_IF_ERROR(
      variability::Step(*program, variability::FixedBatch(groups_->program.dp_index)).status());
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("Adam step", [&] { program->adam->step(); }));
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat("creating '", dir, "': ", error.message()));
  }
  trainer::SaveOptions options;
  options.include_rng_streams = true;
  LOCKSTEP_RETURN_IF_ERROR(program->trainer->SaveState(absl::StrCat(dir, "/rank", world_.rank()),
                                                       program->parameters, program->adam.get(),
                                                       options));
  // What was saved, for the actors to compare what they loaded against (a load that restores
  // less than was saved makes both actors alike and wrong).
  LOCKSTEP_ASSIGN_OR_RETURN(numerics::Inventory saved, ActorInventory(*program));
  return WriteFileAtomically(SavedInventoryPath(dir, world_.rank()),
                             DumpJson(numerics::InventoryJson(saved), 1));
}

absl::Status VariabilityRank::RunActor(const std::string& state_dir, const std::string& prefix) {
  DeterministicMode deterministic;
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::unique_ptr<Program> program,
      variability::MakeProgram(groups_->program, variability::StepPlacement(control_)));
  const int rank = world_.rank();
  LOCKSTEP_ASSIGN_OR_RETURN(trainer::LoadReport loaded,
                            program->trainer->LoadState(absl::StrCat(state_dir, "/rank", rank),
                                                        program->parameters, program->adam.get()));
  if (loaded.weights != static_cast<int>(program->parameters.size()) || !loaded.optimizer ||
      !loaded.rng_streams) {
    return absl::InternalError("the actor's saved state was not restored in full");
  }
  if (control_ == NegativeControl::kActorPartialLoad) {
    // The bug: the load leaves Adam's state behind.
    LOCKSTEP_RETURN_IF_ERROR(
        CallTorch("dropping Adam's state", [&] { program->adam->state().clear(); }));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(numerics::Inventory inventory, ActorInventory(*program));
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::string saved_text,
      ReadFileToString(SavedInventoryPath(state_dir, rank), kMaxActorEvidenceBytes));
  LOCKSTEP_ASSIGN_OR_RETURN(json saved, ParseJson(saved_text, SavedInventoryPath(state_dir, rank)));
  const json loaded_json = numerics::InventoryJson(inventory);
  std::vector<std::string> restored_less = numerics::InventoryDifferences(saved, loaded_json);
  const json context = numerics::CaptureExecutionContext(
      {{"topology", absl::StrCat("DP", topology_.dp_size(), " x TP", topology_.tp_size(), " x CP",
                                 topology_.cp_size())},
       {"rank", absl::StrCat(rank)},
       {"device", device_.str()}});
  numerics::Recording recording({});
  LOCKSTEP_ASSIGN_OR_RETURN(
      numerics::NamedTensors outputs,
      variability::RecordedStep(*program, groups_->program.dp_index, recording));
  numerics::ActorEvidence evidence;
  evidence.inventory = loaded_json;
  evidence.context = context;
  evidence.saved_vs_loaded = std::move(restored_less);
  evidence.outputs = std::move(outputs);
  for (const auto& [name, tensor] : program->parameters) {
    if (tensor.grad().defined()) evidence.gradients.emplace_back(name, tensor.grad());
  }
  evidence.recording = std::move(recording);
  return numerics::WriteActorEvidence(prefix, rank, evidence);
}

absl::StatusOr<VariabilityCheck> CompareActors(const std::string& prefix_a,
                                               const std::string& prefix_b, int rank) {
  LOCKSTEP_ASSIGN_OR_RETURN(numerics::VerdictEvidence verdict,
                            numerics::CompareActorEvidence(prefix_a, prefix_b, rank));
  VariabilityCheck check;
  check.name = "actors";
  check.passed = verdict.passed;
  check.detail = std::move(verdict.detail);
  check.evidence = std::move(verdict.evidence);
  return check;
}

}  // namespace qualification
}  // namespace lockstep
