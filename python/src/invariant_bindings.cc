// lockstep._C's placement-invariant mode (invariant/mode.h) and its kernels (invariant/ops.h),
// for a model written in Python: the mode's scope, its exact gradient sums (ExactGradients), and
// Linear, Embedding, LayerNorm, Gelu, CrossEntropy and (sharded) sequence attention as
// differentiable functions of torch tensors. lockstep/invariant.py
// wraps them.

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "invariant/exact_gradients.h"
#include "invariant/mode.h"
#include "invariant/ops.h"
#include "pybind11/stl.h"
#include "python/src/bindings.h"
#include "python/src/status.h"
#include "torch/csrc/utils/pybind.h"

namespace lockstep {
namespace python {

namespace py = pybind11;

void BindInvariant(py::module_& m) {
  py::class_<invariant::PlacementInvariantScope>(m, "_PlacementInvariantScope").def(py::init<>());
  m.def("_placement_invariant_on", &invariant::ModeOn);
  // Python keeps an ExactGradients alive until its sums are written (lockstep/invariant.py): the
  // kernels' backward holds its address (WeightGradient's precondition).
  py::class_<invariant::ExactGradients, std::shared_ptr<invariant::ExactGradients>>(
      m, "_ExactGradients")
      .def(py::init([](std::vector<std::pair<std::string, at::Tensor>> parameters) {
             return std::make_shared<invariant::ExactGradients>(std::move(parameters));
           }),
           py::arg("parameters"))
      .def(
          "slot_of",
          [](const invariant::ExactGradients& exact, const std::string& name) {
            return ValueOrThrow(exact.SlotOf(name));
          },
          py::arg("name"))
      .def(
          "sum_over",
          [](invariant::ExactGradients& exact, collectives::Communicator* group,
             const std::set<std::string>& whole) {
            ThrowIfError(Released([&] { return exact.SumOver(group, whole); }));
          },
          py::arg("group").none(true), py::arg("whole"))
      .def("write_gradients",
           [](invariant::ExactGradients& exact) {
             ThrowIfError(Released([&] { return exact.WriteGradients(); }));
           })
      .def("zero", &invariant::ExactGradients::Zero)
      .def(
          "sums",
          [](invariant::ExactGradients& exact, int slot) { return ValueOrThrow(exact.Sums(slot)); },
          py::arg("slot"));
  py::class_<invariant::ExactSum>(m, "_ExactSum")
      .def(py::init([] { return ValueOrThrow(invariant::ExactSum::Make()); }))
      .def(
          "add",
          [](invariant::ExactSum& sum, const at::Tensor& values) {
            ThrowIfError(Released([&] { return sum.Add(values); }));
          },
          py::arg("values"))
      .def(
          "sum_over",
          [](invariant::ExactSum& sum, collectives::Communicator* group) {
            ThrowIfError(Released([&] { return sum.SumOver(group); }));
          },
          py::arg("group").none(true))
      .def("total", [](invariant::ExactSum& sum) { return ValueOrThrow(sum.Total()); })
      .def("zero", &invariant::ExactSum::Zero);
  m.def(
      "_invariant_linear",
      [](const at::Tensor& x, const at::Tensor& weight, invariant::ExactGradients* exact,
         int slot) {
        return ValueOrThrow(Released([&] { return invariant::Linear(x, weight, {exact, slot}); }));
      },
      py::arg("x"), py::arg("weight"), py::arg("exact").none(true), py::arg("slot"));
  m.def(
      "_invariant_embedding",
      [](const at::Tensor& weight, const at::Tensor& ids, invariant::ExactGradients* exact,
         int slot) {
        return ValueOrThrow(Released([&] {
          return invariant::Embedding(weight, ids, {exact, slot});
        }));
      },
      py::arg("weight"), py::arg("ids"), py::arg("exact").none(true), py::arg("slot"));
  m.def(
      "_invariant_gelu",
      [](const at::Tensor& x) {
        return ValueOrThrow(Released([&] { return invariant::Gelu(x); }));
      },
      py::arg("x"));
  m.def(
      "_invariant_layer_norm",
      [](const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps,
         invariant::ExactGradients* exact, int weight_slot, int bias_slot) {
        return ValueOrThrow(Released([&] {
          return invariant::LayerNorm(x, weight, bias, eps, {exact, weight_slot},
                                      {exact, bias_slot});
        }));
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("eps"), py::arg("exact").none(true),
      py::arg("weight_slot"), py::arg("bias_slot"));
  m.def(
      "_invariant_cross_entropy",
      [](const at::Tensor& logits, const at::Tensor& targets) {
        return ValueOrThrow(Released([&] { return invariant::CrossEntropy(logits, targets); }));
      },
      py::arg("logits"), py::arg("targets"));
  m.def(
      "_invariant_sequence_attention",
      [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
         const at::Tensor& query_tokens, const at::Tensor& key_tokens, double scale) {
        return ValueOrThrow(Released([&] {
          return invariant::SequenceAttention(q, k, v, query_tokens, key_tokens, scale);
        }));
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("query_tokens"), py::arg("key_tokens"),
      py::arg("scale"));
  m.def(
      "_invariant_sharded_sequence_attention",
      [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& tokens,
         double scale, int64_t widest, collectives::Communicator* group) {
        return ValueOrThrow(Released([&] {
          return invariant::ShardedSequenceAttention(q, k, v, tokens, scale, widest, group);
        }));
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("tokens"), py::arg("scale"),
      py::arg("widest"), py::arg("group").none(true));
}

}  // namespace python
}  // namespace lockstep
