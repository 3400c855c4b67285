// lockstep._C's numerics part: strict comparison of tensors and of named sets under a tolerance,
// and inventories with their digests, of named tensors or of a safetensors file. Results cross
// as the JSON the C++ library (and the compare/inventory tools) write, which lockstep/numerics.py
// turns into result objects, so the figures are the library's own, to the last digit.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/grad_mode.h"
#include "base/json.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "numerics/compare.h"
#include "numerics/digest.h"
#include "numerics/inventory.h"
#include "numerics/named_tensors.h"
#include "numerics/safetensors.h"
#include "python/src/bindings.h"
#include "python/src/status.h"
#include "python/src/tolerance.h"
#include "torch/csrc/utils/pybind.h"

namespace lockstep {
namespace python {
namespace {

namespace py = pybind11;

}  // namespace

void BindNumerics(py::module_& m) {
  const numerics::Tolerance defaults;
  m.def(
      "_compare_tensors",
      [](const at::Tensor& actual, const at::Tensor& expected, const std::string& name, double atol,
         double rtol, double relative_l2, bool nan_equal, bool bitwise) {
        const numerics::Tolerance tolerance =
            ToleranceOf(atol, rtol, relative_l2, nan_equal, bitwise);
        return DumpJson(numerics::ComparisonJson(
            ValueOrThrow(numerics::CompareTensors(actual, expected, tolerance, name))));
      },
      py::arg("actual"), py::arg("expected"), py::arg("name"), LOCKSTEP_TOLERANCE_ARGS(defaults));
  m.def(
      "_compare_sets",
      [](const numerics::NamedTensors& actual, const numerics::NamedTensors& expected, double atol,
         double rtol, double relative_l2, bool nan_equal, bool bitwise) {
        const numerics::Tolerance tolerance =
            ToleranceOf(atol, rtol, relative_l2, nan_equal, bitwise);
        const at::NoGradGuard no_grad;  // Note [Named sets as given]
        return DumpJson(numerics::SetComparisonJson(
            ValueOrThrow(numerics::CompareTensorSets(actual, expected, tolerance))));
      },
      py::arg("actual"), py::arg("expected"), LOCKSTEP_TOLERANCE_ARGS(defaults));
  // An inventory stays a C++ value: its JSON is written only when asked for (lockstep.numerics.
  // Inventory reads the few fields it needs from here), since a state of tens of thousands of
  // tensors spends longer on its JSON, written and parsed again, than on its digests.
  py::class_<numerics::Inventory>(m, "_InventoryHandle")
      .def_property_readonly("state_digest",
                             [](const numerics::Inventory& inventory) {
                               return numerics::DigestHex128(inventory.state_digest());
                             })
      .def_property_readonly(
          "tensors",
          [](const numerics::Inventory& inventory) { return inventory.entries().size(); })
      .def_property_readonly("bytes", &numerics::Inventory::total_bytes)
      .def("json", [](const numerics::Inventory& inventory) {
        return DumpJson(numerics::InventoryJson(inventory));
      });
  // Note [Named sets as given]
  // lockstep.numerics passes a named set's tensors as the program holds them, not detached (a
  // detach per tensor is a dispatched call, and a state has tens of thousands): the readers below
  // run without autograd instead, so that nothing they do is recorded on a tensor.
  m.def("_inventory", [](const numerics::NamedTensors& tensors) {
    const at::NoGradGuard no_grad;  // Note [Named sets as given]
    return ValueOrThrow(Released([&] { return numerics::Inventory::Of(tensors); }));
  });
  m.def("_inventory_of_file", [](const std::string& path) {
    return ValueOrThrow(Released([&]() -> absl::StatusOr<numerics::Inventory> {
      LOCKSTEP_ASSIGN_OR_RETURN(const numerics::SafetensorsFile file,
                                numerics::SafetensorsFile::Open(path));
      return numerics::Inventory::OfFile(file);
    }));
  });
  m.def(
      "_write_safetensors",
      [](const std::string& path, const numerics::NamedTensors& tensors,
         const std::map<std::string, std::string>& metadata) {
        const at::NoGradGuard no_grad;  // Note [Named sets as given]
        ThrowIfError(Released([&] { return numerics::WriteSafetensors(path, tensors, metadata); }));
      },
      py::arg("path"), py::arg("tensors"), py::arg("metadata"));
  m.def("_read_safetensors", [](const std::string& path) {
    const numerics::SafetensorsFile file = ValueOrThrow(numerics::SafetensorsFile::Open(path));
    return py::make_tuple(ValueOrThrow(file.Tensors()), file.metadata());
  });
  m.def("tensor_digest", [](const at::Tensor& tensor) {
    return numerics::DigestHex128(ValueOrThrow(numerics::DigestTensor(tensor)));
  });
}

}  // namespace python
}  // namespace lockstep
