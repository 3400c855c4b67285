// packing_invariance (variability.h): the placements of a sequence that lockstep itself chooses,
// compared sequence by sequence, module by module.

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "invariant/mode.h"
#include "invariant/ops.h"
#include "numerics/compare.h"
#include "qualification/variability.h"
#include "qualification/variability_internal.h"
#include "qualification/variability_program.h"

namespace lockstep {
namespace qualification {
namespace {

using nlohmann::json;
using variability::Placement;
using variability::Program;

// Every module's output rows of each sequence, as this rank's shard computed them (CPU copies).
class SequenceProbes : public ModuleTaps {
 public:
  explicit SequenceProbes(std::map<int64_t, int64_t> lengths) : lengths_(std::move(lengths)) {}

  at::Tensor Enter(const std::string&, const at::Tensor& input) override { return input; }
  at::Tensor Exit(const std::string& module, const at::Tensor& output, const at::Tensor& ids,
                  const at::Tensor& positions) override {
    const at::Tensor rows = output.detach().to(at::kCPU);
    const auto id = ids.accessor<int64_t, 1>();
    const auto position = positions.accessor<int64_t, 1>();
    for (int64_t r = 0; r < rows.size(0); ++r) {
      Probe& probe = probes_[module][id[r]];
      if (!probe.rows.defined()) {
        probe.rows = at::zeros({lengths_.at(id[r]), rows.size(1)}, rows.options());
        probe.filled = at::zeros({lengths_.at(id[r])}, at::kBool);
      }
      probe.rows[position[r]].copy_(rows[r]);
      probe.filled[position[r]] = true;
    }
    return output;
  }

  // Fills in the rows the other members of the CP group computed (their shards are disjoint,
  // so a sum over the group assembles every row), so that any rank can name the first module.
  absl::Status Complete(collectives::Communicator& cp, c10::Device device) {
    const std::vector<std::string> names = ReferenceModel::ModuleNames();
    int64_t total = 0;
    for (const auto& [id, length] : lengths_) total += length;
    const int64_t modules = static_cast<int64_t>(names.size());
    at::Tensor rows = at::zeros({modules, total, ReferenceModel::kWidth});
    at::Tensor filled = at::zeros({modules, total});
    auto each = [&](auto visit) {
      for (int64_t m = 0; m < modules; ++m) {
        int64_t offset = 0;
        for (const auto& [id, length] : lengths_) {
          visit(m, id, offset, length);
          offset += length;
        }
      }
    };
    each([&](int64_t m, int64_t id, int64_t offset, int64_t length) {
      const Probe* probe = Find(names[m], id);
      if (probe == nullptr) return;
      rows[m].narrow(0, offset, length).copy_(probe->rows);
      filled[m].narrow(0, offset, length).copy_(probe->filled);
    });
    rows = rows.to(device);
    filled = filled.to(device);
    LOCKSTEP_RETURN_IF_ERROR(cp.AllReduceSum(rows));
    LOCKSTEP_RETURN_IF_ERROR(cp.AllReduceSum(filled));
    rows = rows.to(at::kCPU);
    filled = filled.to(at::kCPU);
    each([&](int64_t m, int64_t id, int64_t offset, int64_t length) {
      Probe& probe = probes_[names[m]][id];
      probe.rows = rows[m].narrow(0, offset, length).clone();
      probe.filled = filled[m].narrow(0, offset, length) > 0;
    });
    return absl::OkStatus();
  }

  struct Probe {
    at::Tensor rows;    // [length, width]
    at::Tensor filled;  // bool [length]: rows this rank computed
  };
  const Probe* Find(const std::string& module, int64_t id) const {
    auto m = probes_.find(module);
    if (m == probes_.end()) return nullptr;
    auto p = m->second.find(id);
    return p == m->second.end() ? nullptr : &p->second;
  }

 private:
  std::map<int64_t, int64_t> lengths_;
  std::map<std::string, std::map<int64_t, Probe>> probes_;
};

struct PlacementRun {
  std::string name;
  int microbatches = 0;
  int ooms = 0;
  std::map<int64_t, at::Tensor> outputs;  // per sequence id: [length, width], CPU
  std::map<int64_t, double> loss;         // per sequence id: its loss contribution
  std::shared_ptr<SequenceProbes> probes;
  // Under placement-invariant mode: the step's gradients (exact sums over every call and the CP
  // group, Note [Exact accumulation]) per parameter, CPU.
  std::map<std::string, at::Tensor> gradients;
};

// Runs the forward of FixedBatch in `placement` (`alone`: one call per sequence).
absl::StatusOr<PlacementRun> RunPlacement(const variability::ProgramGroups& groups,
                                          const Placement& placement, bool alone) {
  PlacementRun run;
  run.name = placement.name;
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Program> program,
                            variability::MakeProgram(groups, placement));
  const trainer::TrainerInputs batch = variability::FixedBatch(groups.dp_index);
  const std::vector<int64_t> offsets = variability::SequenceOffsets(batch);
  std::map<int64_t, int64_t> lengths;
  for (const planner::Sequence& s : batch.sequences) lengths[s.id] = s.num_tokens;
  run.probes = std::make_shared<SequenceProbes>(lengths);
  program->model->SetTaps(run.probes);
  std::vector<trainer::TrainerInputs> calls;
  if (alone) {
    for (size_t i = 0; i < batch.sequences.size(); ++i) {
      calls.push_back(trainer::TrainerInputs::Of(
          {batch.sequences[i]}, batch.rows.slice(0, offsets[i], offsets[i + 1]).clone()));
    }
  } else {
    calls.push_back(batch);
  }
  // Under the mode the step's backward runs too, its gradients summed exactly.
  const bool backward = program->exact != nullptr;
  for (trainer::TrainerInputs& call : calls) {
    const std::vector<planner::Sequence> sequences = call.sequences;
    const std::vector<int64_t> call_offsets = variability::SequenceOffsets(call);
    LOCKSTEP_ASSIGN_OR_RETURN(variability::StepResult step,
                              variability::Step(*program, std::move(call), backward));
    run.microbatches += static_cast<int>(step.microbatches.size());
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("per-sequence outputs", [&] {
      for (const trainer::MicrobatchOutput& out : step.microbatches) {
        const at::Tensor outputs = out.outputs.detach().to(at::kCPU);
        // The loss head's product: under placement-invariant mode, the mode's.
        absl::StatusOr<at::Tensor> scores = variability::HeadScores(
            *program, out.outputs.detach(), /*invariant=*/invariant::ModeOn());
        if (!scores.ok()) ThrowAsTorchError(scores.status());
        const at::Tensor z = scores->detach().squeeze(1).to(at::kCPU);
        const at::Tensor weights = out.loss_weights.to(at::kCPU);
        const at::Tensor input_rows = out.input_rows.to(at::kCPU);
        const auto row = input_rows.accessor<int64_t, 1>();
        // Each token's output row, and its loss term (summed below in position order, whatever
        // the packing).
        std::vector<std::tuple<int64_t, int64_t, double>> terms;  // row, sequence id, term
        for (int64_t t = 0; t < outputs.size(0); ++t) {
          size_t s = 0;
          while (call_offsets[s + 1] <= row[t]) ++s;
          const int64_t id = sequences[s].id;
          at::Tensor& rows = run.outputs[id];
          if (!rows.defined())
            rows = at::zeros({sequences[s].num_tokens, outputs.size(1)}, outputs.options());
          rows[row[t] - call_offsets[s]].copy_(outputs[t]);
          const double zt = z[t].item<float>();
          terms.emplace_back(
              row[t], id,
              weights[t].item<double>() * static_cast<double>(static_cast<float>(zt * zt)));
        }
        std::sort(terms.begin(), terms.end());
        for (const auto& [r, id, term] : terms) run.loss[id] += term;
      }
    }));
  }
  program->model->SetTaps(nullptr);
  run.ooms = program->ooms_injected;
  if (backward) {
    LOCKSTEP_RETURN_IF_ERROR(
        variability::FinishGradients(*program, placement.unsharded ? nullptr : groups.cp));
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("the step's gradients", [&] {
      for (const auto& [name, parameter] : program->parameters) {
        run.gradients[name] = parameter.grad().defined() ? parameter.grad().detach().to(at::kCPU)
                                                         : at::zeros_like(parameter, at::kCPU);
      }
    }));
  }
  if (!placement.unsharded && groups.cp != nullptr) {
    LOCKSTEP_RETURN_IF_ERROR(run.probes->Complete(*groups.cp, groups.device));
  }
  return run;
}

// Where a sequence's loss contribution differs while the model's outputs agree.
constexpr char kLossHead[] = "loss head (the caller's)";

struct SequenceDifference {
  int64_t id = 0;
  std::string module;  // the first module whose rows differ ("" when none of this rank's)
  json figures;
  bool loss_equal = true;
};

// How `run` differs from `base`, per sequence.
absl::StatusOr<std::vector<SequenceDifference>> Differences(const PlacementRun& base,
                                                            const PlacementRun& run) {
  std::vector<SequenceDifference> differences;
  for (const auto& [id, rows] : base.outputs) {
    auto other = run.outputs.find(id);
    const bool outputs_equal = other != run.outputs.end() && at::equal(rows, other->second);
    const bool loss_equal = run.loss.count(id) && run.loss.at(id) == base.loss.at(id);
    if (outputs_equal && loss_equal) continue;
    SequenceDifference d;
    d.id = id;
    d.loss_equal = loss_equal;
    if (outputs_equal) {
      // The model agrees; the caller's loss head, a matmul over the whole microbatch, does not.
      d.module = kLossHead;
      const double a = base.loss.at(id), b = run.loss.count(id) ? run.loss.at(id) : 0.0;
      d.figures = {{"max_abs_diff", std::abs(a - b)},
                   {"relative_l2", std::abs(a - b) / std::max(std::abs(a), 1e-300)}};
      differences.push_back(std::move(d));
      continue;
    }
    for (const std::string& module : ReferenceModel::ModuleNames()) {
      const SequenceProbes::Probe* a = base.probes->Find(module, id);
      const SequenceProbes::Probe* b = run.probes->Find(module, id);
      if (a == nullptr || b == nullptr) continue;
      const at::Tensor both = a->filled & b->filled;
      if (!both.any().item<bool>()) continue;
      const at::Tensor ra = a->rows.index({both}), rb = b->rows.index({both});
      if (at::equal(ra, rb)) continue;
      LOCKSTEP_ASSIGN_OR_RETURN(numerics::TensorComparison c,
                                numerics::CompareTensors(rb, ra, numerics::Tolerance(), module));
      d.module = module;
      d.figures = numerics::ComparisonJson(c);
      break;
    }
    differences.push_back(std::move(d));
  }
  return differences;
}

// Which of the step's gradients differ between `base` and `run` (both under the mode), as
// summaries naming the parameter and by how much.
absl::StatusOr<std::vector<std::string>> GradientDifferences(const PlacementRun& base,
                                                             const PlacementRun& run) {
  std::vector<std::string> out;
  for (const auto& [name, gradient] : base.gradients) {
    auto other = run.gradients.find(name);
    if (other == run.gradients.end()) {
      out.push_back(absl::StrCat(run.name, " vs ", base.name, ": no gradient of ", name));
      continue;
    }
    if (at::equal(gradient, other->second)) continue;
    LOCKSTEP_ASSIGN_OR_RETURN(
        numerics::TensorComparison c,
        numerics::CompareTensors(other->second, gradient, numerics::Tolerance(), name));
    const json figures = numerics::ComparisonJson(c);
    out.push_back(absl::StrCat(
        run.name, " vs ", base.name, ": the step's gradient of ", name,
        absl::StrFormat(" differs: max |diff| %.3g, relative L2 %.3g",
                        figures.value("max_abs_diff", 0.0), figures.value("relative_l2", 0.0))));
  }
  return out;
}

std::string DifferenceSummary(const SequenceDifference& d, const std::string& placement,
                              const std::string& against) {
  std::string s = absl::StrCat("sequence ", d.id, " ", placement, " vs ", against);
  if (d.module.empty()) return absl::StrCat(s, " differs, in no module's output");
  return absl::StrCat(
      s, " first differs at ", d.module,
      absl::StrFormat(": max |diff| %.3g, relative L2 %.3g", d.figures.value("max_abs_diff", 0.0),
                      d.figures.value("relative_l2", 0.0)));
}

}  // namespace

absl::StatusOr<VariabilityCheck> VariabilityRank::PackingInvariance() {
  DeterministicMode deterministic;
  const variability::ProgramGroups& groups = groups_->program;
  const std::string broken =
      control_ == NegativeControl::kNondeterministicOp ? kNondeterministicModule : "";
  auto placement = [&](std::string name, int64_t budget) {
    Placement p;
    p.name = std::move(name);
    p.budget = budget;
    p.loss_normalization = planner::LOSS_SUM;  // a sequence's weights whatever else is planned
    p.dropout = false;
    p.broken_module = broken;
    p.libtorch_attention = control_ == NegativeControl::kLibTorchAttention;
    p.exact_gradients = true;  // under placement-invariant mode: the gradients compared too
    return p;
  };
  struct Planned {
    Placement placement;
    bool alone;
  };
  std::vector<Planned> planned = {{placement("alone", 48), true},
                                  {placement("packed under a 48-token cap", 48), false},
                                  {placement("packed under a 24-token cap", 24), false}};
  Placement split = placement("split by out-of-memory recovery", 48);
  split.inject_oom = true;
  planned.push_back({split, false});
  const bool unsharded = topology_.cp_size() > 1 && topology_.tp_size() == 1;
  if (unsharded) {
    Placement whole = placement("unsharded (CP 1)", 48);
    whole.unsharded = true;
    planned.push_back({whole, false});
  }

  std::vector<PlacementRun> runs;
  std::vector<std::string> unreproduced;
  json placements = json::array();
  for (const Planned& p : planned) {
    LOCKSTEP_ASSIGN_OR_RETURN(PlacementRun first, RunPlacement(groups, p.placement, p.alone));
    LOCKSTEP_ASSIGN_OR_RETURN(PlacementRun again, RunPlacement(groups, p.placement, p.alone));
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<SequenceDifference> rerun, Differences(first, again));
    for (const SequenceDifference& d : rerun) {
      unreproduced.push_back(DifferenceSummary(d, p.placement.name, "its rerun"));
    }
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<std::string> rerun_gradients,
                              GradientDifferences(first, again));
    unreproduced.insert(unreproduced.end(), rerun_gradients.begin(), rerun_gradients.end());
    placements.push_back({{"name", p.placement.name},
                          {"budget", p.placement.budget},
                          {"microbatches", first.microbatches},
                          {"out_of_memory_injected", first.ooms},
                          {"reproduced", rerun.empty()}});
    runs.push_back(std::move(first));
  }
  std::vector<std::string> placement_dependent;
  int pairs = 0;
  for (size_t i = 1; i < runs.size(); ++i) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<SequenceDifference> differs,
                              Differences(runs[0], runs[i]));
    json sequences = json::array();
    for (const SequenceDifference& d : differs) {
      placement_dependent.push_back(DifferenceSummary(d, runs[i].name, runs[0].name));
      sequences.push_back({{"sequence", d.id},
                           {"first_module", d.module},
                           {"loss_equal", d.loss_equal},
                           {"figures", d.figures}});
    }
    pairs += static_cast<int>(runs[0].outputs.size());
    placements[i]["differences_from_alone"] = std::move(sequences);
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<std::string> gradients,
                              GradientDifferences(runs[0], runs[i]));
    placements[i]["gradient_differences_from_alone"] = gradients;
    placement_dependent.insert(placement_dependent.end(), gradients.begin(), gradients.end());
  }

  VariabilityCheck check;
  check.name = "packing_invariance";
  // Differences between placements are the ops' (and named); a placement that does not reproduce
  // its own bits is nondeterminism, which fails. Under placement-invariant mode a difference
  // between placements fails too: the mode promises the same bits.
  const bool invariant_mode = invariant::ModeOn();
  check.passed = unreproduced.empty() && (!invariant_mode || placement_dependent.empty());
  check.evidence = {{"placement_invariant_mode", invariant_mode},
                    {"placements", placements},
                    {"unreproduced", unreproduced},
                    {"placement_dependent", placement_dependent}};
  std::vector<std::string> shapes;
  for (size_t i = 0; i < runs.size(); ++i) {
    shapes.push_back(absl::StrCat(runs[i].name, " (", runs[i].microbatches, " microbatches",
                                  runs[i].ooms > 0 ? ", 1 split" : "", ")"));
  }
  if (unreproduced.empty() && !check.passed) {
    check.detail = absl::StrCat(
        "placement-dependent under placement-invariant mode: ", placement_dependent.size(),
        " difference(s) from alone (of ", pairs,
        " (sequence, placement) pairs and the step's gradients); first: ", placement_dependent[0]);
  } else if (!check.passed) {
    check.detail =
        absl::StrCat("not reproducible (nondeterminism, not placement): ", unreproduced.size(),
                     " sequence(s); first: ", unreproduced[0]);
  } else if (placement_dependent.empty()) {
    check.detail = absl::StrCat(
        runs[0].outputs.size(), " sequences' outputs and loss contributions bit-identical across ",
        runs.size(), " placements",
        runs[0].gradients.empty()
            ? ""
            : absl::StrCat(" (and the step's ", runs[0].gradients.size(), " gradients)"),
        invariant_mode ? " under placement-invariant mode" : "",
        ", each reproduced: ", absl::StrJoin(shapes, "; "),
        unsharded ? ""
                  : (topology_.cp_size() > 1
                         ? "; unsharded not compared (TP > 1 reduces in another order by design)"
                         : ""));
  } else {
    check.detail = absl::StrCat(
        "placement-dependent, not nondeterminism (every placement reproduces its bits): ",
        placement_dependent.size(), " of ", pairs,
        " (sequence, placement) pairs differ from alone; first: ", placement_dependent[0]);
  }
  return check;
}

}  // namespace qualification
}  // namespace lockstep
