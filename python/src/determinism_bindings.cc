// lockstep._C's determinism part: numerics' deterministic mode (enforce, verify) and the
// execution-context record with its digest and differences. Records cross as JSON text, which
// lockstep/determinism.py parses, so digests are computed by the C++ library over its own dump.

#include <map>
#include <string>
#include <vector>

#include "base/json.h"
#include "nlohmann/json.hpp"
#include "numerics/deterministic_mode.h"
#include "numerics/execution_context.h"
#include "python/src/bindings.h"
#include "python/src/status.h"
#include "torch/csrc/utils/pybind.h"

namespace lockstep {
namespace python {
namespace {

namespace py = pybind11;

nlohmann::json Parsed(const std::string& text) {
  return ValueOrThrow(ParseJson(text, "an execution-context record"));
}

}  // namespace

void BindDeterminism(py::module_& m) {
  m.def("_enforce_deterministic_mode", [] {
    const numerics::DeterministicSettings s = ValueOrThrow(numerics::EnforceDeterministicMode());
    return py::dict(
        py::arg("deterministic_algorithms") = s.deterministic_algorithms,
        py::arg("deterministic_algorithms_warn_only") = s.deterministic_algorithms_warn_only,
        py::arg("cudnn_deterministic") = s.cudnn_deterministic,
        py::arg("cudnn_benchmark") = s.cudnn_benchmark,
        // None where unset (Note [cuBLAS workspace setting]).
        py::arg("cublas_workspace_config") = s.cublas_workspace_config.empty()
                                                 ? py::object(py::none())
                                                 : py::object(py::str(s.cublas_workspace_config)),
        py::arg("cublas_workspace_config_required") = s.cublas_workspace_config_required,
        py::arg("nccl_algo") = s.nccl_algo, py::arg("nccl_proto") = s.nccl_proto);
  });
  m.def("_verify_deterministic_mode", [] { ThrowIfError(numerics::VerifyDeterministicMode()); });
  m.def("_deterministic_mode_enforced", &numerics::DeterministicModeEnforced);
  m.def("_execution_context", [](const std::map<std::string, std::string>& caller) {
    return DumpJson(numerics::CaptureExecutionContext(caller));
  });
  m.def("_context_digest",
        [](const std::string& context) { return numerics::ContextDigest(Parsed(context)); });
  m.def("_context_differences", [](const std::string& a, const std::string& b) {
    return numerics::ContextDifferences(Parsed(a), Parsed(b));
  });
}

}  // namespace python
}  // namespace lockstep
