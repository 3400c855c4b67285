// lockstep._C's trainer part: TrainerRank with a Python forward adapter, over a TP x CP group
// adopted from torch.distributed. lockstep/trainer.py wraps it (an iterator for the microbatch
// stream, keyword arguments, the forward's own exception chained to the trainer's error).

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/communicator.h"
#include "collectives/topology.h"
#include "numerics/named_tensors.h"
#include "planner/planner.h"
#include "python/src/bindings.h"
#include "python/src/planner_names.h"
#include "python/src/python_function.h"
#include "python/src/status.h"
#include "rng/rank_streams.h"
#include "torch/csrc/autograd/python_variable.h"
#include "torch/csrc/utils/pybind.h"
#include "trainer/saved_state.h"
#include "trainer/shard_work.h"
#include "trainer/trainer_config.h"
#include "trainer/trainer_rank.h"

namespace lockstep {
namespace python {
namespace {

namespace py = pybind11;

// The forward adapter: the trainer calls it on the thread that called into the trainer, which
// released the GIL (Note [GIL] in status.h), so it takes the GIL for the call. A Python exception
// becomes the forward's error status (the trainer agrees on it across the group);
// lockstep/trainer.py chains the original exception to what it raises.
trainer::ForwardAdapter Forward(py::function fn) {
  auto held = std::make_shared<PythonFunction>(std::move(fn));
  return [held](const trainer::ShardWork& work) -> absl::StatusOr<at::Tensor> {
    py::gil_scoped_acquire gil;
    try {
      py::object out = held->fn(py::cast(&work, py::return_value_policy::reference));
      if (!THPVariable_Check(out.ptr())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the forward returned ", std::string(py::str(py::type::of(out).attr("__name__"))),
            ", not a tensor"));
      }
      return out.cast<at::Tensor>();
    } catch (py::error_already_set& e) {
      return absl::InternalError(absl::StrCat("the Python forward raised ", e.what()));
    }
  };
}

trainer::CustomObjectFactory Factory(py::function fn) {
  auto held = std::make_shared<PythonFunction>(std::move(fn));
  return [held]() -> absl::StatusOr<numerics::NamedTensors> {
    py::gil_scoped_acquire gil;
    try {
      return held->fn().cast<numerics::NamedTensors>();
    } catch (py::error_already_set& e) {
      return absl::InternalError(absl::StrCat("the Python factory raised ", e.what()));
    } catch (py::cast_error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("the factory must return a list of (name, tensor): ", e.what()));
    }
  };
}

trainer::TrainerInputs Inputs(const at::Tensor& rows, const std::vector<int64_t>& lengths,
                              const std::optional<std::vector<int64_t>>& ids,
                              const std::optional<std::vector<std::vector<float>>>& weights) {
  if ((ids && ids->size() != lengths.size()) || (weights && weights->size() != lengths.size())) {
    Raise(absl::InvalidArgumentError(
        absl::StrCat("ids and loss_weights need one entry per sequence (", lengths.size(), ")")));
  }
  std::vector<planner::Sequence> sequences;
  for (size_t i = 0; i < lengths.size(); ++i) {
    sequences.push_back(planner::Sequence::Of(lengths[i], ids ? (*ids)[i] : static_cast<int64_t>(i),
                                              weights ? (*weights)[i] : std::vector<float>()));
  }
  return trainer::TrainerInputs::Of(std::move(sequences), rows);
}

py::tuple Output(const trainer::MicrobatchOutput& out) {
  return py::make_tuple(out.microbatch, out.outputs, out.input_rows, out.loss_weights);
}

// A stream the Python iterator pulls from; finished once Next() returned nullopt or an error.
struct Stream {
  std::optional<trainer::MicrobatchStream> stream;
};

}  // namespace

void BindTrainer(py::module_& m) {
  py::class_<trainer::ShardWork>(m, "ShardWork")
      .def_readonly("microbatch", &trainer::ShardWork::microbatch)
      .def_readonly("cp_rank", &trainer::ShardWork::cp_rank)
      .def_readonly("cp_size", &trainer::ShardWork::cp_size)
      .def_readonly("forward_index", &trainer::ShardWork::forward_index)
      .def_readonly("inputs", &trainer::ShardWork::inputs)
      .def_readonly("widest_shard", &trainer::ShardWork::widest_shard)
      .def_property_readonly("packed_offsets", &trainer::ShardWork::packed_offsets)
      .def_property_readonly("sequence_ids", &trainer::ShardWork::sequence_ids)
      .def_property_readonly("positions", &trainer::ShardWork::positions)
      .def(
          "run_block",
          [](const trainer::ShardWork& work, py::function block,
             const std::vector<at::Tensor>& inputs) {
            checkpoint::CheckpointedFunction fn = Block(std::move(block));
            return ValueOrThrow(Released([&] { return work.RunBlock(fn, inputs); }));
          },
          py::arg("block"), py::arg("inputs"));

  py::class_<Stream>(m, "_MicrobatchStream").def("next", [](Stream& s) -> py::object {
    if (!s.stream.has_value()) return py::none();
    absl::StatusOr<std::optional<trainer::MicrobatchOutput>> next =
        Released([&] { return s.stream->Next(); });
    if (!next.ok() || !next->has_value()) s.stream.reset();
    std::optional<trainer::MicrobatchOutput> out = ValueOrThrow(std::move(next));
    if (!out.has_value()) return py::none();
    return Output(*out);
  });

  py::class_<trainer::TrainerRank>(m, "_TrainerRank")
      .def(py::init([](py::function forward, std::shared_ptr<rng::RankStreams> streams,
                       std::shared_ptr<collectives::Communicator> tp_cp_group, int world_size,
                       int world_rank, int tp, int cp, int64_t max_tokens,
                       bool activation_checkpointing, const std::string& packing,
                       const std::string& loss_normalization) {
             const collectives::Topology topology =
                 ValueOrThrow(collectives::Topology::Create(world_size, tp, cp));
             trainer::TrainerConfig config = trainer::TrainerConfig::Of(max_tokens);
             config.activation_checkpointing = activation_checkpointing;
             config.plan.packing = PackingNamed(packing);
             config.plan.loss_normalization = LossNormalizationNamed(loss_normalization);
             trainer::ForwardAdapter adapter = Forward(std::move(forward));
             return ValueOrThrow(Released([&] {
               return trainer::TrainerRank::Create(
                   std::move(config),
                   trainer::TrainerRank::Collaborators::Of(
                       topology, world_rank, std::move(tp_cp_group), std::move(streams)),
                   std::move(adapter));
             }));
           }),
           py::arg("forward"), py::arg("streams"), py::arg("tp_cp_group").none(true),
           py::arg("world_size"), py::arg("world_rank"), py::arg("tp"), py::arg("cp"),
           py::arg("max_tokens"), py::arg("activation_checkpointing"), py::arg("packing"),
           py::arg("loss_normalization"))
      .def_property_readonly("cp_rank", &trainer::TrainerRank::cp_rank)
      .def_property_readonly("cp_size", &trainer::TrainerRank::cp_size)
      .def(
          "forward_microbatches",
          [](trainer::TrainerRank& t, const at::Tensor& rows, const std::vector<int64_t>& lengths,
             const std::optional<std::vector<int64_t>>& ids,
             const std::optional<std::vector<std::vector<float>>>& weights) {
            trainer::TrainerInputs inputs = Inputs(rows, lengths, ids, weights);
            return Stream{
                ValueOrThrow(Released([&] { return t.ForwardMicrobatches(std::move(inputs)); }))};
          },
          py::arg("rows"), py::arg("lengths"), py::arg("ids").none(true),
          py::arg("loss_weights").none(true))
      .def(
          "forward_all_microbatches",
          [](trainer::TrainerRank& t, const at::Tensor& rows, const std::vector<int64_t>& lengths,
             const std::optional<std::vector<int64_t>>& ids,
             const std::optional<std::vector<std::vector<float>>>& weights) {
            trainer::TrainerInputs inputs = Inputs(rows, lengths, ids, weights);
            py::list outputs;
            for (const trainer::MicrobatchOutput& out : ValueOrThrow(
                     Released([&] { return t.ForwardAllMicrobatches(std::move(inputs)); }))) {
              outputs.append(Output(out));
            }
            return outputs;
          },
          py::arg("rows"), py::arg("lengths"), py::arg("ids").none(true),
          py::arg("loss_weights").none(true))
      .def("register_custom_object",
           [](trainer::TrainerRank& t, const std::string& name, const std::string& metadata,
              py::function factory) {
             trainer::CustomObjectFactory made = Factory(std::move(factory));
             return ValueOrThrow(
                 Released([&] { return t.RegisterCustomObject(name, metadata, std::move(made)); }));
           })
      .def("synchronize_caller",
           [](trainer::TrainerRank& t) {
             ThrowIfError(Released([&] { return t.SynchronizeCaller(); }));
           })
      .def("save_state",
           [](trainer::TrainerRank& t, const std::string& dir,
              const numerics::NamedTensors& weights, bool include_rng_streams) {
             trainer::SaveOptions options;
             options.include_rng_streams = include_rng_streams;
             ThrowIfError(Released([&] { return t.SaveState(dir, weights, nullptr, options); }));
           })
      .def("load_state",
           [](trainer::TrainerRank& t, const std::string& dir, numerics::NamedTensors weights) {
             const trainer::LoadReport report =
                 ValueOrThrow(Released([&] { return t.LoadState(dir, weights, nullptr); }));
             return py::dict(py::arg("weights") = report.weights,
                             py::arg("rng_streams") = report.rng_streams);
           });
}

}  // namespace python
}  // namespace lockstep
