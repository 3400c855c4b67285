#include "examples/lm/model.h"

#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "collectives/differentiable.h"
#include "invariant/mode.h"
#include "rng/philox.h"

namespace lockstep {
namespace examples {
namespace {

// The dropout's index space: sequence ids below kSequenceIds, positions below max_positions.
constexpr int64_t kSequenceIds = int64_t{1} << 24;

// Inside a block (which reports errors by throwing): the value, or the status thrown as the
// LibTorch exception of its code.
template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) ThrowAsTorchError(value.status());
  return *std::move(value);
}

// The dropout keep-mask of hidden units [begin, end) for the shard's tokens: one box of the global
// (sequence id x position, hidden unit) space per run of consecutive positions of one sequence.
at::Tensor DropoutMask(const rng::PhiloxKey& key, const at::Tensor& ids,
                       const at::Tensor& positions, int64_t max_positions, int64_t hidden,
                       int64_t begin, int64_t end, double p, c10::Device device) {
  const int64_t n = ids.size(0);
  const auto id = ids.accessor<int64_t, 1>();
  const auto position = positions.accessor<int64_t, 1>();
  const std::vector<int64_t> global_shape = {kSequenceIds * max_positions, hidden};
  std::vector<at::Tensor> masks;
  for (int64_t t = 0; t < n;) {
    int64_t run = t + 1;
    while (run < n && id[run] == id[t] && position[run] == position[run - 1] + 1) ++run;
    const int64_t row = id[t] * max_positions + position[t];
    masks.push_back(ValueOrThrow(rng::PartitionedDropoutMask(
        key, global_shape, {{row, row + (run - t)}, {begin, end}}, p, device)));
    t = run;
  }
  if (masks.empty())
    return at::zeros({0, end - begin}, at::TensorOptions().dtype(at::kBool).device(device));
  return at::cat(masks);
}

}  // namespace

bool TinyLm::SplitOverTp(const std::string& name) {
  return name.size() > 3 && (name.compare(name.size() - 3, 3, ".w1") == 0 ||
                             name.compare(name.size() - 3, 3, ".w2") == 0);
}

absl::StatusOr<TinyLm> TinyLm::Create(const TinyLmConfig& config, int tp_rank, int tp_size,
                                      collectives::Communicator* tp_group,
                                      collectives::Communicator* cp_group, c10::Device device) {
  if (tp_size < 1 || config.hidden % tp_size != 0 || tp_rank < 0 || tp_rank >= tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("TinyLm: TP rank ", tp_rank, " of ", tp_size,
                                                   " does not split ", config.hidden,
                                                   " hidden units"));
  }
  if (config.width < 1 || config.hidden < 1 || config.blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("TinyLm: width ", config.width, ", hidden ",
                                                   config.hidden, " and blocks ", config.blocks,
                                                   " must each be at least 1"));
  }
  if (config.heads < 1 || config.width % config.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TinyLm: width ", config.width, " does not split over ", config.heads, " heads"));
  }
  numerics::NamedTensors parameters;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("TinyLm: drawing the weights", [&] {
    // The model's own generator: every layout draws the same full weights, and the caller's
    // generator does not move.
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(config.seed);
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    auto draw = [&](std::vector<int64_t> shape, double scale) {
      return at::randn(shape, generator, f32) * scale;
    };
    auto add = [&](const std::string& name, at::Tensor full) {
      parameters.emplace_back(name, full.to(device).requires_grad_());
    };
    const double scale = 1.0 / std::sqrt(static_cast<double>(config.width));
    add("token_embedding", draw({config.vocab, config.width}, 0.5));
    add("position_embedding", draw({config.max_positions, config.width}, 0.1));
    const int64_t shard = config.hidden / tp_size, begin = tp_rank * shard;
    for (int64_t b = 0; b < config.blocks; ++b) {
      const std::string p = absl::StrCat("block", b, ".");
      add(p + "norm1.weight", at::ones({config.width}, f32));
      add(p + "norm1.bias", at::zeros({config.width}, f32));
      for (const char* w : {"wq", "wk", "wv", "wo"}) {
        add(p + w, draw({config.width, config.width}, scale));
      }
      add(p + "norm2.weight", at::ones({config.width}, f32));
      add(p + "norm2.bias", at::zeros({config.width}, f32));
      // The whole matrices are drawn on every rank (the same draws), then each keeps its shard.
      const at::Tensor w1 = draw({config.hidden, config.width}, scale);
      const at::Tensor w2 = draw({config.width, config.hidden}, 1.0 / std::sqrt(config.hidden));
      add(p + "w1", w1.narrow(0, begin, shard).contiguous());
      add(p + "w2", w2.narrow(1, begin, shard).contiguous());
    }
    add("norm.weight", at::ones({config.width}, f32));
    add("norm.bias", at::zeros({config.width}, f32));
  }));
  return TinyLm(config, std::move(parameters), tp_rank, tp_size, tp_group, cp_group);
}

const at::Tensor& TinyLm::Parameter(const std::string& name) const {
  for (const auto& [n, t] : parameters_) {
    if (n == name) return t;
  }
  ThrowAsTorchError(absl::InternalError(absl::StrCat("TinyLm: no parameter '", name, "'")));
}

absl::StatusOr<invariant::WeightGradient> TinyLm::GradientOf(const std::string& name) const {
  if (exact_ == nullptr) return invariant::WeightGradient{};
  LOCKSTEP_ASSIGN_OR_RETURN(const int slot, exact_->SlotOf(name));
  return invariant::WeightGradient{exact_, slot};
}

absl::StatusOr<at::Tensor> TinyLm::Forward(const trainer::ShardWork& work, int64_t step) const {
  const c10::Device device = Parameter("token_embedding").device();
  const int64_t width = config_.width, heads = config_.heads, head_width = width / heads;
  // Read once: a block recomputed in backward runs the kernels its forward ran.
  const bool invariant_kernels = invariant::ModeOn();
  // Under the mode, where each parameter's gradient goes (a name outside the exact sums: none).
  std::map<std::string, invariant::WeightGradient> to;
  if (invariant_kernels) {
    for (const auto& [name, tensor] : parameters_) {
      LOCKSTEP_ASSIGN_OR_RETURN(to[name], GradientOf(name));
    }
  }
  at::Tensor x, query_meta, key_meta;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("TinyLm: embeddings", [&] {
    const at::Tensor positions = work.positions().to(device);
    const at::Tensor inputs = work.inputs.to(device);
    x = invariant_kernels
            ? ValueOrThrow(invariant::Embedding(Parameter("token_embedding"), inputs,
                                                to.at("token_embedding"))) +
                  ValueOrThrow(invariant::Embedding(Parameter("position_embedding"), positions,
                                                    to.at("position_embedding")))
            : at::embedding(Parameter("token_embedding"), inputs) +
                  at::embedding(Parameter("position_embedding"), positions);
    // Each token's (sequence, position), and every CP rank's, padded with -1 (which no query
    // matches), so that a query sees exactly the earlier tokens of its own sequence.
    query_meta = at::stack({work.sequence_ids().to(device), positions}, 1);
  }));
  key_meta = query_meta;
  // (Under the mode, the attention kernel gathers the keys' places itself.)
  if (cp_group_ != nullptr && !invariant_kernels) {
    at::Tensor padded;
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("TinyLm: padding the tokens' places", [&] {
      padded = at::full({work.widest_shard, 2}, -1, query_meta.options());
      padded.narrow(0, 0, query_meta.size(0)).copy_(query_meta);
    }));
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> all, cp_group_->AllGather(padded));
    LOCKSTEP_RETURN_IF_ERROR(
        CallTorch("TinyLm: the keys' places", [&] { key_meta = at::cat(all); }));
  }
  // What the blocks need, by value: under activation checkpointing they run again in backward,
  // after `work` is gone.
  const at::Tensor ids = work.sequence_ids(), positions = work.positions();
  const int64_t widest = work.widest_shard;
  for (int64_t b = 0; b < config_.blocks; ++b) {
    const std::string p = absl::StrCat("block", b, ".");
    trainer::ShardWork::Block block = [=, this](const std::vector<at::Tensor>& in) {
      const at::Tensor& h = in[0];
      if (invariant_kernels) {
        const at::Tensor after_attention = h + InvariantAttention(p, h, query_meta, widest, to);
        return std::vector<at::Tensor>{
            after_attention +
            ValueOrThrow(collectives::ReduceFromGroup(
                InvariantMlp(p, after_attention, ids, positions, b, step, to), tp_group_))};
      }
      const int64_t n = h.size(0);
      // Attention: this shard's queries against every CP rank's keys and values.
      const at::Tensor a =
          at::layer_norm(h, {width}, Parameter(p + "norm1.weight"), Parameter(p + "norm1.bias"));
      const at::Tensor q = at::mm(a, Parameter(p + "wq").t());
      const at::Tensor k = ValueOrThrow(
          collectives::GatherRows(at::mm(a, Parameter(p + "wk").t()), widest, cp_group_));
      const at::Tensor v = ValueOrThrow(
          collectives::GatherRows(at::mm(a, Parameter(p + "wv").t()), widest, cp_group_));
      const int64_t m = k.size(0);
      const at::Tensor visible =
          (query_meta.select(1, 0).unsqueeze(1) == key_meta.select(1, 0).unsqueeze(0)) &
          (key_meta.select(1, 1).unsqueeze(0) <= query_meta.select(1, 1).unsqueeze(1));
      const at::Tensor qh = q.view({n, heads, head_width}).transpose(0, 1);
      const at::Tensor kh = k.view({m, heads, head_width}).transpose(0, 1);
      const at::Tensor vh = v.view({m, heads, head_width}).transpose(0, 1);
      const at::Tensor scores =
          (at::bmm(qh, kh.transpose(1, 2)) / std::sqrt(static_cast<double>(head_width)))
              .masked_fill(at::logical_not(visible).unsqueeze(0),
                           -std::numeric_limits<double>::infinity());
      const at::Tensor attended =
          at::bmm(at::softmax(scores, 2), vh).transpose(0, 1).reshape({n, width});
      const at::Tensor after_attention = h + at::mm(attended, Parameter(p + "wo").t());
      // The MLP, split over TP, with partition-invariant dropout of its hidden units.
      const at::Tensor m_in = at::layer_norm(
          after_attention, {width}, Parameter(p + "norm2.weight"), Parameter(p + "norm2.bias"));
      const at::Tensor in_tp = ValueOrThrow(collectives::CopyToGroup(m_in, tp_group_));
      const at::Tensor hidden_units = at::gelu(at::mm(in_tp, Parameter(p + "w1").t()));
      const at::Tensor partial =
          at::mm(Dropout(hidden_units, ids, positions, b, step), Parameter(p + "w2").t());
      return std::vector<at::Tensor>{
          after_attention + ValueOrThrow(collectives::ReduceFromGroup(partial, tp_group_))};
    };
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> out, work.RunBlock(block, {x}));
    x = out[0];
  }
  // The head, tied to the token embedding.
  return CallTorch("TinyLm: the head", [&]() -> absl::StatusOr<at::Tensor> {
    if (invariant_kernels) {
      const at::Tensor final_norm =
          ValueOrThrow(invariant::LayerNorm(x, Parameter("norm.weight"), Parameter("norm.bias"),
                                            1e-5, to.at("norm.weight"), to.at("norm.bias")));
      return ValueOrThrow(
          invariant::Linear(final_norm, Parameter("token_embedding"), to.at("token_embedding")));
    }
    const at::Tensor final_norm =
        at::layer_norm(x, {width}, Parameter("norm.weight"), Parameter("norm.bias"));
    return at::mm(final_norm, Parameter("token_embedding").t());
  });
}

at::Tensor TinyLm::Dropout(const at::Tensor& hidden_units, const at::Tensor& ids,
                           const at::Tensor& positions, int64_t block, int64_t step) const {
  const int64_t shard = config_.hidden / tp_size_, begin = tp_rank_ * shard;
  const at::Tensor keep = DropoutMask(
      rng::PhiloxKey::Of(config_.seed, static_cast<uint64_t>(block), static_cast<uint64_t>(step)),
      ids, positions, config_.max_positions, config_.hidden, begin, begin + shard, config_.dropout,
      hidden_units.device());
  return hidden_units * keep.to(hidden_units.dtype()) * (1.0 / (1.0 - config_.dropout));
}

at::Tensor TinyLm::InvariantAttention(
    const std::string& p, const at::Tensor& h, const at::Tensor& tokens, int64_t widest,
    const std::map<std::string, invariant::WeightGradient>& to) const {
  const int64_t heads = config_.heads, head_width = config_.width / heads;
  auto linear = [&](const at::Tensor& in, const std::string& w) {
    return ValueOrThrow(invariant::Linear(in, Parameter(p + w), to.at(p + w)));
  };
  const at::Tensor a = ValueOrThrow(
      invariant::LayerNorm(h, Parameter(p + "norm1.weight"), Parameter(p + "norm1.bias"), 1e-5,
                           to.at(p + "norm1.weight"), to.at(p + "norm1.bias")));
  const at::Tensor q = linear(a, "wq"), k = linear(a, "wk"), v = linear(a, "wv");
  // Each head over its sequence's keys (gathered over CP inside the kernel).
  std::vector<at::Tensor> attended;
  for (int64_t head = 0; head < heads; ++head) {
    auto part = [&](const at::Tensor& t) {
      return t.narrow(1, head * head_width, head_width).contiguous();
    };
    attended.push_back(ValueOrThrow(invariant::ShardedSequenceAttention(
        part(q), part(k), part(v), tokens, 1.0 / std::sqrt(static_cast<double>(head_width)), widest,
        cp_group_)));
  }
  return linear(at::cat(attended, 1), "wo");
}

at::Tensor TinyLm::InvariantMlp(const std::string& p, const at::Tensor& after_attention,
                                const at::Tensor& ids, const at::Tensor& positions, int64_t block,
                                int64_t step,
                                const std::map<std::string, invariant::WeightGradient>& to) const {
  const at::Tensor m_in = ValueOrThrow(invariant::LayerNorm(
      after_attention, Parameter(p + "norm2.weight"), Parameter(p + "norm2.bias"), 1e-5,
      to.at(p + "norm2.weight"), to.at(p + "norm2.bias")));
  const at::Tensor in_tp = ValueOrThrow(collectives::CopyToGroup(m_in, tp_group_));
  const at::Tensor hidden_units = ValueOrThrow(invariant::Gelu(
      ValueOrThrow(invariant::Linear(in_tp, Parameter(p + "w1"), to.at(p + "w1")))));
  return ValueOrThrow(invariant::Linear(Dropout(hidden_units, ids, positions, block, step),
                                        Parameter(p + "w2"), to.at(p + "w2")));
}

}  // namespace examples
}  // namespace lockstep
