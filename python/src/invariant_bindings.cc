// lockstep._C's placement-invariant mode (invariant/mode.h) and its kernels (invariant/ops.h),
// for a model written in Python: the mode's scope, and Linear, LayerNorm, Gelu, CrossEntropy and
// (sharded) sequence attention as differentiable functions of torch tensors. lockstep/invariant.py
// wraps them.

#include <cstdint>
#include <memory>

#include "collectives/communicator.h"
#include "invariant/mode.h"
#include "invariant/ops.h"
#include "python/src/bindings.h"
#include "python/src/status.h"
#include "torch/csrc/utils/pybind.h"

namespace lockstep {
namespace python {

namespace py = pybind11;

void BindInvariant(py::module_& m) {
  py::class_<invariant::PlacementInvariantScope>(m, "_PlacementInvariantScope").def(py::init<>());
  m.def("_placement_invariant_on", &invariant::ModeOn);
  m.def(
      "_invariant_linear",
      [](const at::Tensor& x, const at::Tensor& weight) {
        return ValueOrThrow(Released([&] { return invariant::Linear(x, weight); }));
      },
      py::arg("x"), py::arg("weight"));
  m.def(
      "_invariant_gelu",
      [](const at::Tensor& x) {
        return ValueOrThrow(Released([&] { return invariant::Gelu(x); }));
      },
      py::arg("x"));
  m.def(
      "_invariant_layer_norm",
      [](const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
        return ValueOrThrow(Released([&] { return invariant::LayerNorm(x, weight, bias, eps); }));
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("eps"));
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
