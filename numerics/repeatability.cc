#include "numerics/repeatability.h"

#include <set>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "nlohmann/json.hpp"

namespace lockstep {
namespace numerics {
namespace {

// The default generators the step may draw from, and their states before the cold pass.
struct GeneratorStates {
  std::vector<at::Generator> generators;
  std::vector<at::Tensor> states;
};

GeneratorStates Capture(const NamedTensors& parameters) {
  GeneratorStates saved;
  saved.generators.push_back(at::detail::getDefaultCPUGenerator());
  std::set<int> devices;
  for (const auto& [name, p] : parameters) {
    if (p.is_cuda()) devices.insert(p.device().index());
  }
  for (int d : devices) {
    saved.generators.push_back(at::globalContext().defaultGenerator(at::Device(at::kCUDA, d)));
  }
  for (at::Generator& g : saved.generators) {
    std::lock_guard<std::mutex> lock(g.mutex());
    saved.states.push_back(g.get_state());
  }
  return saved;
}

void Restore(GeneratorStates& saved) {
  for (size_t i = 0; i < saved.generators.size(); ++i) {
    std::lock_guard<std::mutex> lock(saved.generators[i].mutex());
    saved.generators[i].set_state(saved.states[i]);
  }
}

}  // namespace

absl::StatusOr<RepeatabilityReport> RunRepeatability(const StepFunction& step,
                                                     const NamedTensors& parameters,
                                                     const Tolerance& tolerance) {
  LOCKSTEP_RETURN_IF_ERROR(tolerance.Validate());
  GeneratorStates saved;
  LOCKSTEP_RETURN_IF_ERROR(
      CallTorch("saving the RNG state for the passes", [&] { saved = Capture(parameters); }));
  static constexpr const char* kPasses[] = {"cold", "warm1", "warm2"};
  std::vector<NamedTensors> results;
  for (const char* pass : kPasses) {
    LOCKSTEP_RETURN_IF_ERROR(CallTorch(absl::StrCat("preparing the ", pass, " pass"), [&] {
      Restore(saved);
      for (const auto& [name, p] : parameters) {
        if (p.grad().defined()) const_cast<at::Tensor&>(p).mutable_grad() = at::Tensor();
      }
    }));
    absl::StatusOr<NamedTensors> outputs = step();
    if (!outputs.ok()) {
      return Annotate(outputs.status(), absl::StrCat("in the ", pass, " pass"));
    }
    NamedTensors kept;
    LOCKSTEP_RETURN_IF_ERROR(CallTorch(absl::StrCat("keeping the ", pass, " pass's results"), [&] {
      for (const auto& [name, t] : *outputs) {
        kept.emplace_back(absl::StrCat("output/", name), t.detach().clone());
      }
      for (const auto& [name, p] : parameters) {
        if (p.grad().defined()) kept.emplace_back(absl::StrCat("grad/", name), p.grad().clone());
      }
    }));
    results.push_back(std::move(kept));
  }
  RepeatabilityReport report;
  LOCKSTEP_ASSIGN_OR_RETURN(report.warm1_vs_cold,
                            CompareTensorSets(results[1], results[0], tolerance));
  LOCKSTEP_ASSIGN_OR_RETURN(report.warm2_vs_warm1,
                            CompareTensorSets(results[2], results[1], tolerance));
  return report;
}

nlohmann::json RepeatabilityJson(const RepeatabilityReport& report) {
  return {{"repeatable", report.repeatable()},
          {"warm1_vs_cold", SetComparisonJson(report.warm1_vs_cold)},
          {"warm2_vs_warm1", SetComparisonJson(report.warm2_vs_warm1)}};
}

}  // namespace numerics
}  // namespace lockstep
