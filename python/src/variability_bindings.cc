// lockstep._C's variability part: the repeatability harness over a Python step, the actors'
// evidence written and compared (numerics/variability_evidence.h), and a rank's state captured
// for the state-replay protocol (replay/state_capture.h). lockstep/variability.py and
// lockstep/replay.py give them their Python shape.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/json.h"
#include "nlohmann/json.hpp"
#include "numerics/divergence.h"
#include "numerics/named_tensors.h"
#include "numerics/repeatability.h"
#include "numerics/variability_evidence.h"
#include "python/src/bindings.h"
#include "python/src/status.h"
#include "python/src/tolerance.h"
#include "replay/state_capture.h"
#include "rng/rank_streams.h"
#include "torch/csrc/utils/pybind.h"

namespace lockstep {
namespace python {
namespace {

namespace py = pybind11;

std::string VerdictJson(const numerics::VerdictEvidence& verdict) {
  return DumpJson(
      {{"passed", verdict.passed}, {"detail", verdict.detail}, {"evidence", verdict.evidence}});
}

nlohmann::json Parsed(const std::string& text, const char* what) {
  return ValueOrThrow(ParseJson(text, what));
}

// The harness over `step`, a Python callable returning (outputs, recording or None). A Python
// exception the step raises leaves the harness as a status and is raised again, unchanged.
std::string RunRepeatability(py::function step, const numerics::NamedTensors& parameters,
                             const numerics::Tolerance& tolerance) {
  std::vector<numerics::Recording> passes;
  std::optional<py::error_already_set> failure;
  numerics::StepFunction call = [&]() -> absl::StatusOr<numerics::NamedTensors> {
    try {
      py::tuple result = step();
      if (result.size() != 2) {
        return absl::InvalidArgumentError("the step must return (outputs, recording or None)");
      }
      passes.push_back(result[1].is_none() ? numerics::Recording({})
                                           : result[1].cast<numerics::Recording>());
      return result[0].cast<numerics::NamedTensors>();
    } catch (py::error_already_set& e) {
      failure = e;
      return absl::AbortedError("the step raised");
    }
  };
  absl::StatusOr<numerics::RepeatabilityReport> report =
      numerics::RunRepeatability(call, parameters, tolerance);
  if (failure.has_value()) throw *failure;
  const numerics::VerdictEvidence verdict = ValueOrThrow(
      numerics::RepeatabilityEvidence(ValueOrThrow(std::move(report)), passes, tolerance));
  return VerdictJson(verdict);
}

}  // namespace

void BindVariability(py::module_& m) {
  m.def(
      "_run_repeatability",
      [](py::function step, const numerics::NamedTensors& parameters, double atol, double rtol,
         double relative_l2, bool nan_equal, bool bitwise) {
        return RunRepeatability(std::move(step), parameters,
                                ToleranceOf(atol, rtol, relative_l2, nan_equal, bitwise));
      },
      py::arg("step"), py::arg("parameters"), LOCKSTEP_TOLERANCE_ARGS(numerics::Tolerance()));
  m.def(
      "_write_actor_evidence",
      [](const std::string& prefix, int rank, const std::string& inventory,
         const std::string& context, std::vector<std::string> saved_vs_loaded,
         numerics::NamedTensors outputs, numerics::NamedTensors gradients,
         const numerics::Recording& recording) {
        numerics::ActorEvidence evidence;
        evidence.inventory = Parsed(inventory, "an inventory");
        evidence.context = Parsed(context, "an execution context");
        evidence.saved_vs_loaded = std::move(saved_vs_loaded);
        evidence.outputs = std::move(outputs);
        evidence.gradients = std::move(gradients);
        evidence.recording = recording;
        ThrowIfError(
            Released([&] { return numerics::WriteActorEvidence(prefix, rank, evidence); }));
      },
      py::arg("prefix"), py::arg("rank"), py::arg("inventory"), py::arg("context"),
      py::arg("saved_vs_loaded"), py::arg("outputs"), py::arg("gradients"), py::arg("recording"));
  m.def("_compare_actors", [](const std::string& a, const std::string& b, int rank) {
    return VerdictJson(
        ValueOrThrow(Released([&] { return numerics::CompareActorEvidence(a, b, rank); })));
  });
  m.def("_inventory_differences", [](const std::string& a, const std::string& b) {
    return numerics::InventoryDifferences(Parsed(a, "an inventory"), Parsed(b, "an inventory"));
  });
  m.def(
      "_capture_state",
      [](const std::string& root, int64_t step, int rank, int world_size,
         numerics::NamedTensors weights, numerics::NamedTensors optimizer_state,
         std::shared_ptr<rng::RankStreams> streams, std::optional<int64_t> data_position,
         std::optional<int64_t> ledger_step, numerics::NamedTensors program_rng,
         std::map<std::string, std::string> program_rng_absent,
         std::map<std::string, std::string> absent) {
        replay::CaptureComponents c;
        c.weights = std::move(weights);
        c.optimizer_state = std::move(optimizer_state);
        c.streams = streams.get();
        c.data_position = data_position;
        c.ledger_step = ledger_step;
        c.program_rng = std::move(program_rng);
        c.program_rng_absent = std::move(program_rng_absent);
        c.absent = std::move(absent);
        ThrowIfError(
            Released([&] { return replay::WriteStateCapture(root, step, rank, world_size, c); }));
      },
      py::arg("root"), py::arg("step"), py::arg("rank"), py::arg("world_size"), py::arg("weights"),
      py::arg("optimizer_state"), py::arg("streams").none(true),
      py::arg("data_position").none(true), py::arg("ledger_step").none(true),
      py::arg("program_rng"), py::arg("program_rng_absent"), py::arg("absent"));
}

}  // namespace python
}  // namespace lockstep
