// lockstep._C's checkpoint part: checkpoint::Checkpoint with a Python function as the block.
// lockstep/checkpoint.py gives it torch.utils.checkpoint.checkpoint's call shape (non-tensor
// arguments, a single-tensor result); here the function takes and returns a list of tensors.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/rng_state_saver.h"
#include "python/src/bindings.h"
#include "python/src/python_function.h"
#include "python/src/status.h"
#include "rng/rank_streams.h"
#include "torch/csrc/utils/pybind.h"

namespace lockstep {
namespace python {
namespace {

namespace py = pybind11;

}  // namespace

void BindCheckpoint(py::module_& m) {
  m.def(
      "_checkpoint",
      [](py::function fn, const std::vector<at::Tensor>& inputs,
         std::shared_ptr<rng::RankStreams> streams, const std::vector<std::string>& names) {
        checkpoint::CheckpointOptions options;
        if (streams != nullptr) {
          options.rng_streams = checkpoint::StreamSnapshots::Of(std::move(streams), names);
        }
        checkpoint::CheckpointedFunction block = Block(std::move(fn));
        return ValueOrThrow(
            Released([&] { return checkpoint::Checkpoint(block, inputs, options); }));
      },
      py::arg("fn"), py::arg("inputs"), py::arg("streams").none(true), py::arg("names"));
  m.def("retained_checkpoint_state", [] {
    const checkpoint::RetainedCheckpointState state = checkpoint::RetainedState();
    return py::dict(py::arg("nodes") = state.nodes, py::arg("rng_bytes") = state.rng_bytes);
  });
}

}  // namespace python
}  // namespace lockstep
