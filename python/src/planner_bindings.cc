// lockstep._C's planner part: a plan of microbatches from sequence lengths (and optional ids and
// per-token loss weights), with what a rank reads from it: each microbatch's packing, position
// ids, token loss weights and CP shard token indices, the plan digest replicas compare, the
// plan's bytes and their verification against the batch.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "planner/plan_check.h"
#include "planner/planner.h"
#include "python/src/bindings.h"
#include "python/src/planner_names.h"
#include "python/src/status.h"
#include "torch/csrc/utils/pybind.h"

namespace lockstep {
namespace python {
namespace {

namespace py = pybind11;

// A plan with the batch it was made from (token loss weights and verification need both).
struct PyPlan {
  planner::Plan plan;
  std::vector<planner::Sequence> batch;

  const planner::Microbatch& At(int microbatch) const {
    if (microbatch < 0 || microbatch >= plan.microbatches_size()) {
      Raise(absl::OutOfRangeError(absl::StrCat("microbatch ", microbatch, " is outside [0, ",
                                               plan.microbatches_size(), ")")));
    }
    return plan.microbatches(microbatch);
  }
};

std::vector<planner::Sequence> Batch(
    const std::vector<int64_t>& lengths, const std::optional<std::vector<int64_t>>& ids,
    const std::optional<std::vector<std::vector<float>>>& weights) {
  if (ids.has_value() && ids->size() != lengths.size()) {
    Raise(absl::InvalidArgumentError(
        absl::StrCat("ids has ", ids->size(), " entries for ", lengths.size(), " sequences")));
  }
  if (weights.has_value() && weights->size() != lengths.size()) {
    Raise(absl::InvalidArgumentError(absl::StrCat("loss_weights has ", weights->size(),
                                                  " entries for ", lengths.size(), " sequences")));
  }
  std::vector<planner::Sequence> batch;
  for (size_t i = 0; i < lengths.size(); ++i) {
    batch.push_back(planner::Sequence::Of(lengths[i], ids ? (*ids)[i] : static_cast<int64_t>(i),
                                          weights ? (*weights)[i] : std::vector<float>()));
  }
  return batch;
}

at::Tensor LongTensor(const std::vector<int64_t>& values) { return at::tensor(values, at::kLong); }

py::dict Describe(const planner::Microbatch& mb) {
  return py::dict(
      py::arg("num_tokens") = mb.num_tokens(),
      py::arg("batch_index") =
          std::vector<int32_t>(mb.batch_index().begin(), mb.batch_index().end()),
      py::arg("sequence_id") =
          std::vector<int64_t>(mb.sequence_id().begin(), mb.sequence_id().end()),
      py::arg("cu_seqlens") = std::vector<int64_t>(mb.cu_seqlens().begin(), mb.cu_seqlens().end()));
}

}  // namespace

void BindPlanner(py::module_& m) {
  py::class_<PyPlan>(m, "Plan")
      .def_property_readonly("num_microbatches",
                             [](const PyPlan& p) { return p.plan.microbatches_size(); })
      .def_property_readonly("num_tokens", [](const PyPlan& p) { return p.plan.num_tokens(); })
      .def_property_readonly("num_sequences",
                             [](const PyPlan& p) { return p.plan.num_sequences(); })
      .def_property_readonly("cp_size", [](const PyPlan& p) { return p.plan.limits().cp_size(); })
      .def_property_readonly("packing_efficiency",
                             [](const PyPlan& p) { return planner::PackingEfficiency(p.plan); })
      .def_property_readonly("digest",
                             [](const PyPlan& p) { return DigestHex(planner::PlanDigest(p.plan)); })
      .def("microbatch", [](const PyPlan& p, int i) { return Describe(p.At(i)); })
      .def("position_ids",
           [](const PyPlan& p, int i) {
             return LongTensor(ValueOrThrow(planner::PositionIds(p.At(i))));
           })
      .def("token_loss_weights",
           [](const PyPlan& p, int i) {
             return at::tensor(ValueOrThrow(planner::TokenLossWeights(p.At(i), p.batch)),
                               at::kDouble);
           })
      .def(
          "shard_token_indices",
          [](const PyPlan& p, int i, int cp_rank) {
            p.At(i);
            return LongTensor(ValueOrThrow(planner::ShardTokenIndices(p.plan, i, cp_rank)));
          },
          py::arg("microbatch"), py::arg("cp_rank"))
      .def("split",
           [](const PyPlan& p, int i) {
             p.At(i);
             return PyPlan{ValueOrThrow(planner::SplitMicrobatch(p.plan, i)), p.batch};
           })
      .def("serialize", [](const PyPlan& p) { return py::bytes(planner::SerializePlan(p.plan)); })
      .def("verify", [](const PyPlan& p) { ThrowIfError(planner::VerifyPlan(p.plan, p.batch)); });

  m.def(
      "plan_microbatches",
      [](const std::vector<int64_t>& lengths, int64_t max_tokens, int cp_size,
         const std::string& packing, const std::string& loss_normalization,
         const std::optional<std::vector<int64_t>>& ids,
         const std::optional<std::vector<std::vector<float>>>& loss_weights) {
        PyPlan p;
        p.batch = Batch(lengths, ids, loss_weights);
        planner::PlanOptions options = planner::PlanOptions::Of(max_tokens, cp_size);
        options.packing = PackingNamed(packing);
        options.loss_normalization = LossNormalizationNamed(loss_normalization);
        p.plan = ValueOrThrow(planner::PlanMicrobatches(p.batch, options));
        return p;
      },
      py::arg("lengths"), py::arg("max_tokens"), py::arg("cp_size") = 1,
      py::arg("packing") = "first_fit_decreasing", py::arg("loss_normalization") = "token_mean",
      py::arg("ids") = py::none(), py::arg("loss_weights") = py::none());

  m.def(
      "parse_plan",
      [](const py::bytes& data, const std::vector<int64_t>& lengths,
         const std::optional<std::vector<int64_t>>& ids,
         const std::optional<std::vector<std::vector<float>>>& loss_weights) {
        PyPlan p;
        p.batch = Batch(lengths, ids, loss_weights);
        if (!p.plan.ParseFromString(static_cast<std::string>(data))) {
          Raise(absl::DataLossError(
              absl::StrCat("the plan's ", py::len(data), " bytes do not parse")));
        }
        ThrowIfError(planner::VerifyPlan(p.plan, p.batch));
        return p;
      },
      py::arg("data"), py::arg("lengths"), py::arg("ids") = py::none(),
      py::arg("loss_weights") = py::none());
}

}  // namespace python
}  // namespace lockstep
