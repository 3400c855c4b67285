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

absl::StatusOr<json> RecordComparisons(const numerics::Recording& a, const numerics::Recording& b) {
  json records = json::array();
  const size_t n = std::min(a.records().size(), b.records().size());
  for (size_t i = 0; i < n; ++i) {
    const numerics::Record& ra = a.records()[i];
    const numerics::Record& rb = b.records()[i];
    json entry = {{"index", ra.index},
                  {"module", ra.module},
                  {"kind", numerics::RecordKindName(ra.kind)},
                  {"digest_equal", ra.digest == rb.digest}};
    if (ra.module != rb.module || ra.kind != rb.kind || !ra.tensor.defined() ||
        !rb.tensor.defined()) {
      entry["structure_differs"] = ra.module != rb.module || ra.kind != rb.kind;
      records.push_back(std::move(entry));
      continue;
    }
    LOCKSTEP_ASSIGN_OR_RETURN(
        numerics::TensorComparison c,
        numerics::CompareTensors(rb.tensor, ra.tensor, numerics::Tolerance()));
    const json figures = numerics::ComparisonJson(c);
    for (const char* key : {"outcome", "bitwise_equal", "max_abs_diff", "max_tolerance_ratio",
                            "relative_l2", "elements"}) {
      entry[key] = figures[key];
    }
    records.push_back(std::move(entry));
  }
  return records;
}

absl::StatusOr<RecordingsVerdict> CompareRecordings(const numerics::Recording& a,
                                                    const numerics::Recording& b) {
  RecordingsVerdict verdict;
  LOCKSTEP_ASSIGN_OR_RETURN(verdict.first, numerics::FirstDivergence(a, b));
  LOCKSTEP_ASSIGN_OR_RETURN(json records, RecordComparisons(a, b));
  json leaves = json::array();
  std::map<std::string, int> verdicts;
  for (const numerics::Record& r : a.records()) {
    if (r.kind != numerics::RecordKind::kAccumulatedGradient) continue;
    absl::StatusOr<numerics::GradientLocalization> leaf =
        numerics::LocalizeParameterGradient(a, b, r.module);
    if (!leaf.ok()) {
      leaves.push_back({{"parameter", r.module}, {"error", leaf.status().ToString()}});
      ++verdicts["unlocalized"];
      continue;
    }
    if (leaf->verdict == numerics::GradientLocalization::kSame) continue;
    leaves.push_back(numerics::GradientLocalizationJson(*leaf));
    ++verdicts[numerics::GradientVerdictName(leaf->verdict)];
  }
  std::vector<std::string> counts;
  for (const auto& [name, count] : verdicts) counts.push_back(absl::StrCat(count, " ", name));
  verdict.leaves_summary = counts.empty() ? "every parameter's accumulated gradient identical"
                                          : absl::StrCat("parameters whose gradient differs: ",
                                                         absl::StrJoin(counts, ", "));
  verdict.evidence = {{"first_divergence", numerics::DivergenceJson(verdict.first)},
                      {"records", std::move(records)},
                      {"leaf_gradients", std::move(leaves)}};
  return verdict;
}

std::string DivergenceSummary(const std::optional<numerics::Divergence>& first) {
  if (!first.has_value()) return "no module record differs";
  std::string s = absl::StrCat("first divergence at ", first->module, " (",
                               numerics::RecordKindName(first->kind), ", record ", first->index,
                               ", ", first->reason, ")");
  if (first->comparison.has_value()) {
    const numerics::TensorComparison& c = *first->comparison;
    absl::StrAppend(&s, absl::StrFormat(": max |diff| %.3g, relative L2 %.3g, tolerance ratio %.3g",
                                        c.max_abs_diff, c.relative_l2, c.max_tolerance_ratio));
  }
  return s;
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
  VariabilityCheck check;
  check.name = "repeatability";
  check.passed = report.repeatable();
  // The pair to localize: warm1 against cold, or (when those agree) warm2 against warm1.
  const bool cold_differs = !report.warm1_vs_cold.all_passed();
  const numerics::Recording& a = cold_differs ? passes[0] : passes[1];
  const numerics::Recording& b = cold_differs ? passes[1] : passes[2];
  LOCKSTEP_ASSIGN_OR_RETURN(variability::RecordingsVerdict verdict,
                            variability::CompareRecordings(a, b));
  check.evidence = verdict.evidence;
  check.evidence["compared"] = cold_differs ? "warm1 vs cold" : "warm2 vs warm1";
  check.evidence["report"] = numerics::RepeatabilityJson(report);
  check.evidence["context"] = numerics::CaptureExecutionContext();
  const numerics::SetComparison& set = report.warm1_vs_cold;
  if (check.passed) {
    check.detail = absl::StrCat("cold, warm1, warm2 in deterministic mode: ", set.passed,
                                " outputs and gradients bit-identical, ", a.records().size(),
                                " module and leaf records identical");
  } else {
    const numerics::SetComparison& failed = cold_differs ? set : report.warm2_vs_warm1;
    check.detail =
        absl::StrCat(cold_differs ? "warm1 vs cold" : "warm2 vs warm1", ": ", failed.failed, " of ",
                     failed.passed + failed.failed, " outputs and gradients differ; ",
                     variability::DivergenceSummary(verdict.first), "; ", verdict.leaves_summary);
  }
  return check;
}

namespace {

// An actor's evidence is small (an inventory and a context); far below this.
constexpr size_t kMaxActorEvidenceBytes = size_t{256} << 20;

// The names whose digests differ between two inventories' JSON, or that only one holds.
std::vector<std::string> InventoryDifferences(const json& a, const json& b) {
  std::map<std::string, std::pair<std::string, std::string>> digests;
  for (const json& e : a.value("entries", json::array())) {
    digests[e.value("name", "")].first = e.value("digest", "");
  }
  for (const json& e : b.value("entries", json::array())) {
    digests[e.value("name", "")].second = e.value("digest", "");
  }
  std::vector<std::string> differ;
  for (const auto& [name, pair] : digests) {
    if (pair.first != pair.second) differ.push_back(name);
  }
  return differ;
}

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
  std::vector<std::string> restored_less = InventoryDifferences(saved, loaded_json);
  if (restored_less.empty() &&
      saved.value("state_digest", "") != loaded_json.value("state_digest", "")) {
    restored_less.push_back("state digest");
  }
  const json context = numerics::CaptureExecutionContext(
      {{"topology", absl::StrCat("DP", topology_.dp_size(), " x TP", topology_.tp_size(), " x CP",
                                 topology_.cp_size())},
       {"rank", absl::StrCat(rank)},
       {"device", device_.str()}});
  numerics::Recording recording({});
  LOCKSTEP_ASSIGN_OR_RETURN(
      numerics::NamedTensors outputs,
      variability::RecordedStep(*program, groups_->program.dp_index, recording));
  numerics::NamedTensors tensors;
  for (auto& [name, tensor] : outputs) tensors.emplace_back("output/" + name, tensor);
  for (const auto& [name, tensor] : program->parameters) {
    if (tensor.grad().defined()) tensors.emplace_back("grad/" + name, tensor.grad());
  }
  const std::string base = absl::StrCat(prefix, ".rank", rank);
  LOCKSTEP_RETURN_IF_ERROR(recording.Save(base + ".rec"));
  LOCKSTEP_RETURN_IF_ERROR(numerics::WriteSafetensors(base + ".safetensors", tensors,
                                                      numerics::ContextMetadata(context)));
  const json record = {
      {"inventory", loaded_json}, {"context", context}, {"saved_vs_loaded", restored_less}};
  return WriteFileAtomically(base + ".json", DumpJson(record, 1));
}

namespace {

absl::StatusOr<json> ReadJson(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path, kMaxActorEvidenceBytes);
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrCat("no actor evidence at '", path, "'"));
  }
  LOCKSTEP_RETURN_IF_ERROR(text.status());
  absl::StatusOr<json> parsed = ParseJson(*text, path);
  if (!parsed.ok() || !parsed->is_object() || !parsed->contains("inventory") ||
      !parsed->contains("context")) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not an actor's evidence",
                     parsed.ok() ? "" : absl::StrCat(": ", parsed.status().message())));
  }
  return *std::move(parsed);
}

}  // namespace

absl::StatusOr<VariabilityCheck> CompareActors(const std::string& prefix_a,
                                               const std::string& prefix_b, int rank) {
  const std::string a_base = absl::StrCat(prefix_a, ".rank", rank);
  const std::string b_base = absl::StrCat(prefix_b, ".rank", rank);
  LOCKSTEP_ASSIGN_OR_RETURN(json a, ReadJson(a_base + ".json"));
  LOCKSTEP_ASSIGN_OR_RETURN(json b, ReadJson(b_base + ".json"));
  LOCKSTEP_ASSIGN_OR_RETURN(numerics::SafetensorsFile a_file,
                            numerics::SafetensorsFile::Open(a_base + ".safetensors"));
  LOCKSTEP_ASSIGN_OR_RETURN(numerics::SafetensorsFile b_file,
                            numerics::SafetensorsFile::Open(b_base + ".safetensors"));
  LOCKSTEP_ASSIGN_OR_RETURN(numerics::NamedTensors a_tensors, a_file.Tensors());
  LOCKSTEP_ASSIGN_OR_RETURN(numerics::NamedTensors b_tensors, b_file.Tensors());
  LOCKSTEP_ASSIGN_OR_RETURN(numerics::Recording a_rec, numerics::Recording::Load(a_base + ".rec"));
  LOCKSTEP_ASSIGN_OR_RETURN(numerics::Recording b_rec, numerics::Recording::Load(b_base + ".rec"));

  const std::vector<std::string> inventory_differs =
      InventoryDifferences(a["inventory"], b["inventory"]);
  const bool inventories_equal =
      inventory_differs.empty() &&
      a["inventory"].value("state_digest", "") == b["inventory"].value("state_digest", "");
  const std::vector<std::string> context_differs =
      numerics::ContextDifferences(a["context"], b["context"]);
  LOCKSTEP_ASSIGN_OR_RETURN(
      numerics::SetComparison tensors,
      numerics::CompareTensorSets(b_tensors, a_tensors, numerics::Tolerance::Bitwise()));
  LOCKSTEP_ASSIGN_OR_RETURN(variability::RecordingsVerdict verdict,
                            variability::CompareRecordings(a_rec, b_rec));

  // Each actor against what was saved: two actors whose loads restored the same too little agree
  // with each other.
  std::vector<std::string> restored_less;
  for (const auto& [label, actor] : {std::pair<const char*, const json*>{"a", &a}, {"b", &b}}) {
    const json less = actor->value("saved_vs_loaded", json::array());
    if (!less.is_array() || less.empty()) continue;
    restored_less.push_back(
        absl::StrCat("actor ", label, "'s load restored less than was saved: ", less.size(),
                     " inventory entries differ (first: ",
                     less[0].is_string() ? less[0].get<std::string>() : "?", ")"));
  }

  VariabilityCheck check;
  check.name = "actors";
  check.passed =
      restored_less.empty() && inventories_equal && context_differs.empty() && tensors.all_passed();
  check.evidence = verdict.evidence;
  check.evidence["inventory_a"] = a["inventory"];
  check.evidence["inventory_b"] = b["inventory"];
  check.evidence["inventory_differences"] = inventory_differs;
  check.evidence["context_a"] = a["context"];
  check.evidence["context_b"] = b["context"];
  check.evidence["context_differences"] = context_differs;
  check.evidence["tensors"] = numerics::SetComparisonJson(tensors);
  const std::string state = absl::StrCat(a["inventory"].value("tensors", 0), " tensors, digest ",
                                         a["inventory"].value("state_digest", "").substr(0, 12));
  if (check.passed) {
    check.detail = absl::StrCat("two actor processes loaded the same state: inventories equal (",
                                state, "), contexts equal (digest ",
                                numerics::ContextDigest(a["context"]).substr(0, 12), "), ",
                                tensors.passed, " outputs and gradients bit-identical");
  } else {
    std::vector<std::string> parts = restored_less;
    if (!inventories_equal) {
      parts.push_back(
          absl::StrCat(inventory_differs.size(), " inventory entries differ (first: ",
                       inventory_differs.empty() ? "state digest" : inventory_differs[0], ")"));
    }
    if (!context_differs.empty()) {
      parts.push_back(absl::StrCat("contexts differ in ", absl::StrJoin(context_differs, ", ")));
    }
    if (!tensors.all_passed()) {
      parts.push_back(absl::StrCat(tensors.failed, " of ", tensors.passed + tensors.failed,
                                   " outputs and gradients differ; ",
                                   variability::DivergenceSummary(verdict.first), "; ",
                                   verdict.leaves_summary));
    }
    check.detail = absl::StrJoin(parts, "; ");
  }
  return check;
}

}  // namespace qualification
}  // namespace lockstep
