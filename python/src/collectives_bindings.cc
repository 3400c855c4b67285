// lockstep._C's collectives part: a lockstep Communicator over a torch.distributed process group
// the Python program created (Gloo or NCCL), the form every lockstep call that takes a group
// wants.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives/adopted_communicator.h"
#include "collectives/c10d_group.h"
#include "collectives/communicator.h"
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

// The c10d group lockstep runs a torch.distributed group's collectives on, and its backend's
// name: its Gloo backend when it has one (CPU and CUDA tensors), else its NCCL backend (CUDA
// tensors; LibTorch >= 2.0). LibTorch 1.x's Python groups are the backend itself; from 2.0 a
// ProcessGroup holds one backend per device type. Null when neither.
std::pair<c10::intrusive_ptr<collectives::C10dGroup>, std::string> BackendOf(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
#if TORCH_VERSION_MAJOR >= 2
  auto backend_for = [&](c10::DeviceType type) -> c10::intrusive_ptr<c10d::Backend> {
    try {
      return group->getBackend(type);
    } catch (const std::exception&) {
      return c10::intrusive_ptr<c10d::Backend>();
    }
  };
  if (!group->hasBackends()) return {c10::intrusive_ptr<collectives::C10dGroup>(), ""};
  if (auto cpu = backend_for(c10::DeviceType::CPU);
      cpu && c10::dynamic_intrusive_pointer_cast<c10d::ProcessGroupGloo>(cpu)) {
    return {cpu, "gloo"};
  }
  if (auto cuda = backend_for(c10::DeviceType::CUDA); cuda && cuda->getBackendName() == "nccl") {
    return {cuda, "nccl"};
  }
  return {c10::intrusive_ptr<collectives::C10dGroup>(), ""};
#else
  if (c10::dynamic_intrusive_pointer_cast<c10d::ProcessGroupGloo>(group)) return {group, "gloo"};
  return {c10::intrusive_ptr<collectives::C10dGroup>(), ""};
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
         const std::string& lane_key,
         int cuda_device) -> std::shared_ptr<collectives::Communicator> {
        if (!group) Raise(absl::InvalidArgumentError("the group is None"));
        auto [backend, name] = BackendOf(group);
        if (!backend) {
          Raise(absl::InvalidArgumentError(absl::StrCat(
              "lockstep adopts torch.distributed groups of the Gloo or NCCL backend; this "
              "group's is ",
              group->getBackendName())));
        }
        if (!(timeout_seconds > 0)) {
          Raise(absl::InvalidArgumentError(
              absl::StrCat("timeout ", timeout_seconds, " s: it must be positive")));
        }
        collectives::AdoptedCommunicator::Options options;
        options.global_ranks = std::move(global_ranks);
        options.world_size = world_size;
        options.timeout = absl::Seconds(timeout_seconds);
        options.backend = name;
        options.lane_key = lane_key;
        // torch.distributed's store (a PrefixStore over the init method's), or None: no lane.
        if (!store_object.is_none()) {
          options.store = store_object.cast<c10::intrusive_ptr<c10d::Store>>();
        }
        if (name == "nccl") {
          if (cuda_device < 0) {
            Raise(absl::InvalidArgumentError(
                "an NCCL group needs this rank's CUDA device (torch.cuda.set_device first)"));
          }
          options.staging_device =
              c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(cuda_device));
        }
        return ValueOrThrow(Released([&] {  // with a store, the members meet in it
          return collectives::AdoptedCommunicator::Adopt(std::move(backend), std::move(options));
        }));
      },
      py::arg("group"), py::arg("global_ranks"), py::arg("world_size"), py::arg("timeout_seconds"),
      py::arg("store") = py::none(), py::arg("lane_key") = "", py::arg("cuda_device") = -1);
  m.def(
      "_has_host_lane",
      [](const collectives::Communicator& comm) {
        const auto* adopted = dynamic_cast<const collectives::AdoptedCommunicator*>(&comm);
        return adopted != nullptr && adopted->has_host_lane();
      },
      "Whether the communicator moves small CPU tensors through shared memory.");
}

}  // namespace python
}  // namespace lockstep
