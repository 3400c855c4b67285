// lockstep._C's differentiable collectives (collectives/differentiable.h) over an adopted
// communicator, for a TP/CP model written in Python: CopyToGroup and ReduceFromGroup around a
// tensor-parallel layer, GatherRows and ReduceScatterRows for context-parallel keys and values,
// and a plain all-gather. Their backward runs the matching collective on the same communicator,
// from autograd's engine (which holds no GIL; none is needed there). The forward calls release
// the GIL while they run (Note [GIL] in status.h).

#include <cstdint>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/differentiable.h"
#include "python/src/bindings.h"
#include "python/src/status.h"
#include "torch/csrc/utils/pybind.h"

namespace lockstep {
namespace python {

namespace py = pybind11;

void BindDifferentiable(py::module_& m) {
  m.def(
      "_copy_to_group",
      [](const at::Tensor& x, collectives::Communicator* group) {
        return ValueOrThrow(Released([&] { return collectives::CopyToGroup(x, group); }));
      },
      py::arg("x"), py::arg("group").none(true));
  m.def(
      "_reduce_from_group",
      [](const at::Tensor& x, collectives::Communicator* group) {
        return ValueOrThrow(Released([&] { return collectives::ReduceFromGroup(x, group); }));
      },
      py::arg("x"), py::arg("group").none(true));
  m.def(
      "_gather_rows",
      [](const at::Tensor& x, int64_t widest, collectives::Communicator* group) {
        return ValueOrThrow(Released([&] { return collectives::GatherRows(x, widest, group); }));
      },
      py::arg("x"), py::arg("widest"), py::arg("group").none(true));
  m.def(
      "_reduce_scatter_rows",
      [](const at::Tensor& x, int64_t rows, int64_t widest, collectives::Communicator* group) {
        return ValueOrThrow(
            Released([&] { return collectives::ReduceScatterRows(x, rows, widest, group); }));
      },
      py::arg("x"), py::arg("rows"), py::arg("widest"), py::arg("group").none(true));
  m.def("_all_gather", [](collectives::Communicator& group, const at::Tensor& x) {
    return ValueOrThrow(Released([&] { return group.AllGather(x); }));
  });
  m.def("_all_reduce_sum", [](collectives::Communicator& group, at::Tensor& x) {
    ThrowIfError(Released([&] { return group.AllReduceSum(x); }));
  });
}

}  // namespace python
}  // namespace lockstep
