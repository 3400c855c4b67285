// lockstep._C's recording part: numerics' module recorder (Recorder, Recording, FirstDivergence,
// the leaf-gradient localization, two recordings compared as the variability checks compare
// them), the operator recorder with its scopes and FirstOperatorDivergence, and the planted
// nondeterminism of the negative controls (numerics/shuffled_sum.h). lockstep/recording.py puts
// the Python module hooks around them; results cross as the C++ library's JSON.

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "base/json.h"
#include "nlohmann/json.hpp"
#include "numerics/divergence.h"
#include "numerics/op_divergence.h"
#include "numerics/op_recorder.h"
#include "numerics/op_recording.h"
#include "numerics/shuffled_sum.h"
#include "numerics/variability_evidence.h"
#include "python/src/bindings.h"
#include "python/src/status.h"
#include "python/src/tolerance.h"
#include "torch/csrc/utils/pybind.h"

namespace lockstep {
namespace python {
namespace {

namespace py = pybind11;
using numerics::OperatorRecorder;

// An open OperatorRecorder::Scope as a Python object: closed by close() (or when collected).
struct OperatorScope {
  std::unique_ptr<OperatorRecorder::Scope> scope;
  void Close() { scope.reset(); }
};

std::string RecordsJson(const numerics::Recording& recording) {
  nlohmann::json out = nlohmann::json::array();
  for (const numerics::Record& r : recording.records()) out.push_back(numerics::RecordJson(r));
  return DumpJson(out);
}

void BindModuleRecorder(py::module_& m) {
  py::class_<numerics::Recording>(m, "_Recording")
      .def_static(
          "load",
          [](const std::string& path) { return ValueOrThrow(numerics::Recording::Load(path)); })
      .def("save",
           [](const numerics::Recording& r, const std::string& path) {
             ThrowIfError(Released([&] { return r.Save(path); }));
           })
      .def("__len__", [](const numerics::Recording& r) { return r.records().size(); })
      .def("records_json", &RecordsJson);
  py::class_<numerics::ParameterTap, std::unique_ptr<numerics::ParameterTap>>(m, "_ParameterTap");
  py::class_<numerics::Recorder>(m, "_Recorder")
      .def(py::init([](int keep_full_tensors) {
             numerics::RecorderOptions options;
             options.keep_full_tensors = keep_full_tensors;
             return std::make_unique<numerics::Recorder>(options);
           }),
           py::arg("keep_full_tensors"))
      .def("enter", &numerics::Recorder::Enter)
      .def("exit", &numerics::Recorder::Exit)
      .def("tap_parameter",
           [](numerics::Recorder& r, const std::string& name, const at::Tensor& parameter) {
             return std::make_unique<numerics::ParameterTap>(
                 ValueOrThrow(r.TapParameter(name, parameter)));
           })
      .def("record_accumulated",
           [](numerics::Recorder& r, const std::string& name, const at::Tensor& parameter) {
             ThrowIfError(r.RecordAccumulated(name, parameter));
           })
      // Both complete the deferred device records (a device synchronization): without the GIL.
      .def("check",
           [](const numerics::Recorder& r) { ThrowIfError(Released([&] { return r.status(); })); })
      .def("snapshot", &numerics::Recorder::Snapshot, py::call_guard<py::gil_scoped_release>());
  m.def(
      "_first_divergence",
      [](const numerics::Recording& a, const numerics::Recording& b, double atol, double rtol,
         double relative_l2, bool nan_equal, bool bitwise) {
        const numerics::Tolerance tolerance =
            ToleranceOf(atol, rtol, relative_l2, nan_equal, bitwise);
        const std::optional<numerics::Divergence> d =
            ValueOrThrow(numerics::FirstDivergence(a, b, tolerance));
        nlohmann::json out = numerics::DivergenceJson(d);
        out["summary"] = numerics::DivergenceSummary(d);
        return DumpJson(out);
      },
      py::arg("a"), py::arg("b"), LOCKSTEP_TOLERANCE_ARGS(numerics::Tolerance()));
  m.def("_localize_parameter_gradient",
        [](const numerics::Recording& a, const numerics::Recording& b, const std::string& name) {
          return DumpJson(numerics::GradientLocalizationJson(
              ValueOrThrow(numerics::LocalizeParameterGradient(a, b, name))));
        });
  m.def("_compare_recordings", [](const numerics::Recording& a, const numerics::Recording& b) {
    numerics::RecordingsVerdict verdict = ValueOrThrow(numerics::CompareRecordings(a, b));
    verdict.evidence["summary"] = numerics::DivergenceSummary(verdict.first);
    verdict.evidence["leaves_summary"] = verdict.leaves_summary;
    return DumpJson(verdict.evidence);
  });
}

void BindOperatorRecorder(py::module_& m) {
  py::class_<OperatorScope>(m, "_OperatorScope").def("close", &OperatorScope::Close);
  py::class_<OperatorRecorder, std::unique_ptr<OperatorRecorder>>(m, "_OperatorRecorder")
      .def_static(
          "create",
          [](const std::string& path, int flush_every, int rank,
             std::optional<std::tuple<int64_t, int64_t, int64_t>> window) {
            numerics::OperatorRecorderOptions options;
            options.flush_every = flush_every;
            options.rank = rank;
            if (window.has_value()) {
              options.row_window = numerics::RowWindow{std::get<0>(*window), std::get<1>(*window),
                                                       std::get<2>(*window)};
            }
            return ValueOrThrow(OperatorRecorder::Create(path, options));
          },
          py::arg("path"), py::arg("flush_every"), py::arg("rank"), py::arg("row_window"))
      .def(
          "open_scope",
          [](OperatorRecorder& r, std::string label) {
            auto scope = std::make_unique<OperatorScope>();
            scope->scope = std::make_unique<OperatorRecorder::Scope>(r, std::move(label));
            return scope;
          },
          py::keep_alive<0, 1>())
      .def("flush", [](OperatorRecorder& r) { ThrowIfError(Released([&] { return r.Flush(); })); })
      .def("close", [](OperatorRecorder& r) { ThrowIfError(Released([&] { return r.Close(); })); })
      .def("check", [](const OperatorRecorder& r) { ThrowIfError(r.status()); })
      .def_property_readonly("recorded", &OperatorRecorder::recorded);
  m.def("_first_operator_divergence", [](const std::string& a_path, const std::string& b_path) {
    const numerics::OperatorRecording a = ValueOrThrow(numerics::OperatorRecording::Load(a_path));
    const numerics::OperatorRecording b = ValueOrThrow(numerics::OperatorRecording::Load(b_path));
    const numerics::OperatorDivergence d = numerics::FirstOperatorDivergence(a, b);
    nlohmann::json out = numerics::OperatorDivergenceJson(d);
    out["summary"] = numerics::OperatorDivergenceSummary(d);
    return DumpJson(out);
  });
  m.def("_rounding_residue", &numerics::controls::RoundingResidue);
}

}  // namespace

void BindRecording(py::module_& m) {
  BindModuleRecorder(m);
  BindOperatorRecorder(m);
}

}  // namespace python
}  // namespace lockstep
