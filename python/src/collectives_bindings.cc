// lockstep._C's collectives part: a lockstep Communicator over a torch.distributed process group
// the Python program created (Gloo), the form every lockstep call that takes a group wants.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/gloo_communicator.h"
#include "collectives/topology.h"
#include "python/src/bindings.h"
#include "python/src/status.h"
#include "torch/csrc/api/include/torch/version.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"
#include "torch/csrc/distributed/c10d/Store.hpp"
#include "torch/csrc/utils/pybind.h"

namespace lockstep {
namespace python {
namespace {

namespace py = pybind11;

// The Gloo backend of a torch.distributed group, or null. LibTorch 1.x's Python groups are the
// backend itself; from 2.0 a ProcessGroup holds one backend per device type.
c10::intrusive_ptr<c10d::ProcessGroupGloo> GlooOf(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
#if TORCH_VERSION_MAJOR >= 2
  if (!group->hasBackends()) return nullptr;
  c10::intrusive_ptr<c10d::Backend> backend;
  try {
    backend = group->getBackend(c10::DeviceType::CPU);
  } catch (const std::exception&) {
    return nullptr;
  }
  return c10::dynamic_intrusive_pointer_cast<c10d::ProcessGroupGloo>(backend);
#else
  return c10::dynamic_intrusive_pointer_cast<c10d::ProcessGroupGloo>(group);
#endif
}

}  // namespace

void BindCollectives(py::module_& m) {
  py::class_<collectives::Communicator, std::shared_ptr<collectives::Communicator>>(m,
                                                                                    "Communicator")
      .def_property_readonly("rank", &collectives::Communicator::rank)
      .def_property_readonly("size", &collectives::Communicator::size)
      .def_property_readonly("global_ranks", &collectives::Communicator::global_ranks)
      .def_property_readonly(
          "timeout_seconds",
          [](const collectives::Communicator& c) { return absl::ToDoubleSeconds(c.timeout()); })
      .def("__repr__", [](const collectives::Communicator& c) {
        return absl::StrCat("<lockstep Communicator ", c.DebugName(), ", rank ", c.rank(), ">");
      });

  py::class_<collectives::Topology>(m, "Topology")
      .def(py::init([](int world_size, int tp, int cp) {
             return ValueOrThrow(collectives::Topology::Create(world_size, tp, cp));
           }),
           py::arg("world_size"), py::arg("tp"), py::arg("cp"))
      .def_property_readonly("dp_size", &collectives::Topology::dp_size)
      .def_property_readonly("tp_size", &collectives::Topology::tp_size)
      .def_property_readonly("cp_size", &collectives::Topology::cp_size)
      .def("coordinates",
           [](const collectives::Topology& t, int rank) {
             const collectives::Coordinates c = ValueOrThrow(t.CoordinatesOf(rank));
             return py::make_tuple(c.dp, c.tp, c.cp);
           })
      .def("tp_cp_group", &collectives::Topology::TpCpGroup)
      .def("tp_group", &collectives::Topology::TpGroup)
      .def("cp_group", &collectives::Topology::CpGroup)
      .def("dp_group", &collectives::Topology::DpGroup);

  m.def(
      "_adopt_group",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group, std::vector<int> global_ranks,
         int world_size, double timeout_seconds, const py::object& store_object,
         const std::string& lane_key) -> std::shared_ptr<collectives::Communicator> {
        if (!group) Raise(absl::InvalidArgumentError("the group is None"));
        c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo = GlooOf(group);
        if (!gloo) {
          Raise(absl::InvalidArgumentError(absl::StrCat(
              "lockstep adopts torch.distributed groups of the Gloo backend; this group's is ",
              group->getBackendName())));
        }
        if (!(timeout_seconds > 0)) {
          Raise(absl::InvalidArgumentError(
              absl::StrCat("timeout ", timeout_seconds, " s: it must be positive")));
        }
        // torch.distributed's store (a PrefixStore over the init method's), or None: no lane.
        c10::intrusive_ptr<c10d::Store> store;
        if (!store_object.is_none()) store = store_object.cast<c10::intrusive_ptr<c10d::Store>>();
        return ValueOrThrow(Released([&] {  // with a store, the members meet in it
          return collectives::GlooCommunicator::Adopt(std::move(gloo), std::move(global_ranks),
                                                      world_size, absl::Seconds(timeout_seconds),
                                                      store, lane_key);
        }));
      },
      py::arg("group"), py::arg("global_ranks"), py::arg("world_size"), py::arg("timeout_seconds"),
      py::arg("store") = py::none(), py::arg("lane_key") = "");
  m.def(
      "_has_host_lane",
      [](const collectives::Communicator& comm) {
        const auto* gloo = dynamic_cast<const collectives::GlooCommunicator*>(&comm);
        return gloo != nullptr && gloo->has_host_lane();
      },
      "Whether the communicator moves small CPU tensors through shared memory.");
}

}  // namespace python
}  // namespace lockstep
