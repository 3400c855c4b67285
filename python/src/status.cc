#include "python/src/status.h"

#include <string>

#include "absl/status/status.h"
#include "pybind11/pybind11.h"

namespace lockstep {
namespace python {

namespace py = pybind11;

void Raise(const absl::Status& status) {
  const std::string code = absl::StatusCodeToString(status.code());
  py::object type = py::module_::import("lockstep.errors").attr("error_type")(code);
  py::object error = type(std::string(status.message()), code);
  PyErr_SetObject(type.ptr(), error.ptr());
  throw py::error_already_set();
}

}  // namespace python
}  // namespace lockstep
