#include "qualification/reference_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "collectives/differentiable.h"
#include "invariant/mode.h"
#include "invariant/ops.h"
#include "numerics/shuffled_sum.h"
#include "rng/philox.h"

namespace lockstep {
namespace qualification {
namespace {

using collectives::CopyToGroup;
using collectives::GatherRows;
using collectives::ReduceFromGroup;

// Positions per sequence in the dropout's global index space: row = id * kPositions + position.
constexpr int64_t kPositions = int64_t{1} << 20;
constexpr int64_t kSequenceIds = int64_t{1} << 20;
constexpr uint64_t kDropoutStream = 7;

// Parameter layout: the embedding, then per block these six.
enum BlockWeight { kWq, kWk, kWv, kWo, kW1, kW2, kBlockWeights };
constexpr const char* kBlockWeightNames[kBlockWeights] = {"wq", "wk", "wv", "wo", "w1", "w2"};

// Inside a block (which reports by throwing): the value, or the status thrown as LibTorch's
// exception of its code.
template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) ThrowAsTorchError(value.status());
  return *std::move(value);
}

// The full model's weights: fixed functions of the indices (and of the block).
at::Tensor FullWeight(int block, BlockWeight which) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const double b = block;
  switch (which) {
    case kW1: {  // [hidden, width]
      at::Tensor i = at::arange(ReferenceModel::kHidden, f32).unsqueeze(1);
      at::Tensor j = at::arange(ReferenceModel::kWidth, f32).unsqueeze(0);
      return 0.3 * at::sin(1.7 * i + 0.9 * j + 0.1 + b);
    }
    case kW2: {  // [width, hidden]
      at::Tensor i = at::arange(ReferenceModel::kWidth, f32).unsqueeze(1);
      at::Tensor j = at::arange(ReferenceModel::kHidden, f32).unsqueeze(0);
      return 0.25 * at::cos(0.8 * i - 1.1 * j + 0.3 + b);
    }
    default: {  // [width, width]
      at::Tensor i = at::arange(ReferenceModel::kWidth, f32).unsqueeze(1);
      at::Tensor j = at::arange(ReferenceModel::kWidth, f32).unsqueeze(0);
      const double phase = 0.7 * which + 0.45 * b;
      return 0.35 * at::sin((0.9 + 0.2 * which) * i - (0.4 + 0.3 * which) * j + phase);
    }
  }
}

at::Tensor FullEmbedding() {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  at::Tensor v = at::arange(ReferenceModel::kVocab, f32).unsqueeze(1);
  at::Tensor j = at::arange(ReferenceModel::kWidth, f32).unsqueeze(0);
  return 0.5 * at::sin(1.3 * v + 0.7 * j + 0.2);
}

// The dropout mask of a shard's hidden units [hidden_begin, hidden_end) for its tokens (sequence
// ids and positions, CPU int64 [n]): one contiguous run of positions of one sequence at a time.
absl::StatusOr<at::Tensor> DropoutMask(const rng::PhiloxKey& key, const at::Tensor& ids,
                                       const at::Tensor& positions, int64_t hidden_begin,
                                       int64_t hidden_end, c10::Device device) {
  const int64_t n = ids.size(0);
  const auto id = ids.accessor<int64_t, 1>();
  const auto position = positions.accessor<int64_t, 1>();
  const std::vector<int64_t> global_shape = {kSequenceIds * kPositions, ReferenceModel::kHidden};
  for (int64_t t = 0; t < n; ++t) {
    if (id[t] < 0 || id[t] >= kSequenceIds || position[t] < 0 || position[t] >= kPositions) {
      return absl::InvalidArgumentError(absl::StrCat("reference model: sequence id ", id[t],
                                                     " or position ", position[t],
                                                     " outside its dropout index space"));
    }
  }
  std::vector<at::Tensor> masks;
  for (int64_t t = 0; t < n;) {
    int64_t end = t + 1;
    while (end < n && id[end] == id[t] && position[end] == position[end - 1] + 1) ++end;
    const int64_t row = id[t] * kPositions + position[t];
    const std::vector<rng::Slice> box = {{row, row + (end - t)}, {hidden_begin, hidden_end}};
    LOCKSTEP_ASSIGN_OR_RETURN(
        at::Tensor mask,
        rng::PartitionedDropoutMask(key, global_shape, box, ReferenceModel::kDropout, device));
    masks.push_back(std::move(mask));
    t = end;
  }
  return CallTorch("joining the dropout masks", [&]() -> absl::StatusOr<at::Tensor> {
    return n > 0 ? at::cat(masks)
                 : at::zeros({0, hidden_end - hidden_begin},
                             at::TensorOptions().dtype(at::kBool).device(device));
  });
}

}  // namespace

std::vector<std::string> ReferenceModel::ModuleNames() {
  std::vector<std::string> names = {"embedding"};
  for (int b = 0; b < kBlocks; ++b) {
    names.push_back(absl::StrCat("block", b, ".attention"));
    names.push_back(absl::StrCat("block", b, ".mlp"));
  }
  return names;
}

absl::Status ReferenceModel::BreakDeterminismAt(const std::string& module) {
  const std::vector<std::string> names = ModuleNames();
  if (std::find(names.begin(), names.end(), module) == names.end()) {
    return absl::InvalidArgumentError(absl::StrCat("reference model: no module '", module,
                                                   "' (its modules: ", absl::StrJoin(names, ", "),
                                                   ")"));
  }
  broken_module_ = module;
  return absl::OkStatus();
}

at::Tensor ReferenceModel::Exit(const std::string& module, at::Tensor output, const at::Tensor& ids,
                                const at::Tensor& positions) {
  if (module == broken_module_) output = output + numerics::controls::RoundingResidue(output);
  return taps_ != nullptr ? taps_->Exit(module, output, ids, positions) : output;
}

absl::StatusOr<ReferenceModel> ReferenceModel::Create(int tp_rank, int tp_size,
                                                      collectives::Communicator* tp_group,
                                                      collectives::Communicator* cp_group,
                                                      c10::Device device) {
  if (tp_size < 1 || kHidden % tp_size != 0 || tp_rank < 0 || tp_rank >= tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("reference model: TP rank ", tp_rank, " of ",
                                                   tp_size, " does not split ", kHidden,
                                                   " hidden units evenly"));
  }
  if ((tp_size > 1) != (tp_group != nullptr)) {
    return absl::InvalidArgumentError("reference model: a TP group is needed exactly when TP > 1");
  }
  if (tp_group != nullptr && (tp_group->size() != tp_size || tp_group->rank() != tp_rank)) {
    return absl::InvalidArgumentError(absl::StrCat("reference model: the TP group is member ",
                                                   tp_group->rank(), " of ", tp_group->size(),
                                                   ", not TP rank ", tp_rank, " of ", tp_size));
  }
  numerics::NamedTensors parameters;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("creating the reference model", [&] {
    parameters.emplace_back("embedding", FullEmbedding().to(device).set_requires_grad(true));
    for (int b = 0; b < kBlocks; ++b) {
      for (int w = 0; w < kBlockWeights; ++w) {
        const std::string name = absl::StrCat("block", b, ".", kBlockWeightNames[w]);
        const absl::StatusOr<at::Tensor> shard =
            ShardOf(name, FullWeight(b, static_cast<BlockWeight>(w)), tp_rank, tp_size);
        if (!shard.ok()) ThrowAsTorchError(shard.status());
        parameters.emplace_back(name, shard->to(device).clone().set_requires_grad(true));
      }
    }
  }));
  return ReferenceModel(std::move(parameters), tp_rank, tp_size, tp_group, cp_group);
}

absl::StatusOr<at::Tensor> ReferenceModel::ShardOf(const std::string& name, const at::Tensor& full,
                                                   int tp_rank, int tp_size) {
  if (tp_size < 1 || kHidden % tp_size != 0 || tp_rank < 0 || tp_rank >= tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("reference model: no TP rank ", tp_rank, " of ", tp_size));
  }
  const int64_t shard = kHidden / tp_size, begin = tp_rank * shard;
  if (absl::EndsWith(name, ".w1")) return full.slice(0, begin, begin + shard);
  if (absl::EndsWith(name, ".w2")) return full.slice(1, begin, begin + shard);
  return full;
}

const at::Tensor& ReferenceModel::Weight(int block, int which) const {
  return parameters_[1 + block * kBlockWeights + which].second;
}

absl::StatusOr<at::Tensor> ReferenceModel::Forward(const trainer::ShardWork& work) {
  const at::Tensor& embedding = parameters_[0].second;
  const c10::Device device = embedding.device();
  // Sequence ids and positions of the queries (this shard) and of the keys (the whole
  // microbatch: with CP gathered from the members, padding with id -1, which no query matches).
  at::Tensor query_meta, key_meta, x, padded;
  // Read once per forward: a block recomputed in backward runs the kernels its forward ran.
  const bool invariant_kernels = invariant::ModeOn();
  const bool invariant_attention = invariant_kernels && !libtorch_attention_;
  // Under the mode, where each weight's gradient goes (exact sums, when the caller set them).
  auto destination = [&](const std::string& name) -> absl::StatusOr<invariant::WeightGradient> {
    if (!invariant_kernels || exact_ == nullptr) return invariant::WeightGradient{};
    LOCKSTEP_ASSIGN_OR_RETURN(const int slot, exact_->SlotOf(name));
    return invariant::WeightGradient{exact_.get(), slot};
  };
  LOCKSTEP_ASSIGN_OR_RETURN(const invariant::WeightGradient embedding_to, destination("embedding"));
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("reference forward: the embedding", [&] {
    query_meta = at::stack({work.sequence_ids(), work.positions()}, 1).to(device);
    x = invariant_kernels
            ? ValueOrThrow(invariant::Embedding(embedding, work.inputs.to(device), embedding_to))
            : at::embedding(embedding, work.inputs.to(device));
    padded = at::full({work.widest_shard, 2}, -1, query_meta.options());
    padded.narrow(0, 0, query_meta.size(0)).copy_(query_meta);
  }));
  if (named_streams_ != nullptr) {
    // One factor per forward from the named stream: the same on every replica and in the
    // reference, whatever the shard.
    LOCKSTEP_ASSIGN_OR_RETURN(rng::NamedStreamFork fork,
                              named_streams_->named().Fork(named_stream_));
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("reference forward: the named stream's factor",
                                       [&] { x = x * (0.9 + 0.2 * at::rand({1}, x.options())); }));
    LOCKSTEP_RETURN_IF_ERROR(fork.Exit());
  }
  const at::Tensor ids = work.sequence_ids(), positions = work.positions();
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("reference forward: tapping the embedding",
                                     [&] { x = Exit("embedding", x, ids, positions); }));
  key_meta = query_meta;
  const bool local_attention = split_bug_ == SplitBug::kCpLocalAttention;
  if (cp_group_ != nullptr && !local_attention) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> all, cp_group_->AllGather(padded));
    LOCKSTEP_RETURN_IF_ERROR(
        CallTorch("reference forward: the keys' tokens", [&] { key_meta = at::cat(all, 0); }));
  }
  // The block runs again in backward under activation checkpointing, after `work` is gone: it
  // captures what it needs by value.
  const int64_t widest = work.widest_shard;
  const bool reduce_tp_gradient = split_bug_ != SplitBug::kTpUnreducedGradient;
  // The CP group the keys and values are gathered over (none: this rank's own, the control).
  collectives::Communicator* const keys_from = local_attention ? nullptr : cp_group_;
  for (int b = 0; b < kBlocks; ++b) {
    std::array<invariant::WeightGradient, kBlockWeights> to;
    for (int w = 0; w < kBlockWeights; ++w) {
      LOCKSTEP_ASSIGN_OR_RETURN(to[w],
                                destination(absl::StrCat("block", b, ".", kBlockWeightNames[w])));
    }
    trainer::ShardWork::Block block = [this, b, query_meta, key_meta, ids, positions, widest,
                                       keys_from, reduce_tp_gradient, invariant_kernels,
                                       invariant_attention, to](const std::vector<at::Tensor>& in) {
      const std::string attention = absl::StrCat("block", b, ".attention");
      const std::string mlp = absl::StrCat("block", b, ".mlp");
      // x times weight `which`'s transpose: LibTorch's product, or under the mode one whose rows
      // do not depend on the others (Note [Placement invariance] in invariant/ops.h).
      auto linear = [this, b, invariant_kernels, &to](const at::Tensor& x, int which) {
        const at::Tensor& w = Weight(b, which);
        return invariant_kernels ? ValueOrThrow(invariant::Linear(x, w, to[which]))
                                 : at::mm(x, w.t());
      };
      const at::Tensor h = Enter(attention, in[0]);
      // Attention, causal within each sequence, over every key of the microbatch.
      const at::Tensor q = linear(h, kWq);
      at::Tensor attended;
      if (invariant_attention) {
        // The keys and values are gathered inside, and their gradients computed whole on every
        // member (Note [Placement invariance]).
        attended = ValueOrThrow(invariant::ShardedSequenceAttention(
            q, linear(h, kWk), linear(h, kWv), query_meta,
            1.0 / std::sqrt(static_cast<double>(kWidth)), widest, keys_from));
      } else {
        const at::Tensor keys = ValueOrThrow(GatherRows(linear(h, kWk), widest, keys_from));
        const at::Tensor values = ValueOrThrow(GatherRows(linear(h, kWv), widest, keys_from));
        const at::Tensor visible =
            (query_meta.select(1, 0).unsqueeze(1) == key_meta.select(1, 0).unsqueeze(0)) &
            (key_meta.select(1, 1).unsqueeze(0) <= query_meta.select(1, 1).unsqueeze(1));
        const at::Tensor scores =
            (at::mm(q, keys.t()) / std::sqrt(static_cast<double>(kWidth)))
                .masked_fill(at::logical_not(visible), -std::numeric_limits<double>::infinity());
        attended = at::mm(at::softmax(scores, 1), values);
      }
      const at::Tensor after_attention =
          Enter(mlp, Exit(attention, h + linear(attended, kWo), ids, positions));
      // The TP-split MLP with partition-invariant dropout seeded from the model stream.
      const at::Tensor in_tp = reduce_tp_gradient
                                   ? ValueOrThrow(CopyToGroup(after_attention, tp_group_))
                                   : after_attention;
      const at::Tensor pre = linear(in_tp, kW1);
      const at::Tensor hidden =
          invariant_kernels ? ValueOrThrow(invariant::Gelu(pre)) : at::gelu(pre);
      if (!dropout_) {
        const at::Tensor partial = linear(hidden, kW2);
        return std::vector<at::Tensor>{
            Exit(mlp, after_attention + ValueOrThrow(ReduceFromGroup(partial, tp_group_)), ids,
                 positions)};
      }
      const at::Tensor seed = at::randint(std::numeric_limits<int32_t>::max(), {2},
                                          at::TensorOptions().dtype(at::kLong).device(h.device()))
                                  .cpu();
      const uint64_t key_seed = static_cast<uint64_t>(seed[0].item<int64_t>()) << 31 |
                                static_cast<uint64_t>(seed[1].item<int64_t>());
      const int64_t shard = kHidden / tp_size_, begin = tp_rank_ * shard;
      const at::Tensor mask =
          ValueOrThrow(DropoutMask(rng::PhiloxKey::Of(key_seed, kDropoutStream, b), ids, positions,
                                   begin, begin + shard, h.device()));
      const at::Tensor partial =
          linear(hidden * mask.to(hidden.dtype()) * (1.0 / (1.0 - kDropout)), kW2);
      return std::vector<at::Tensor>{
          Exit(mlp, after_attention + ValueOrThrow(ReduceFromGroup(partial, tp_group_)), ids,
               positions)};
    };
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> out, work.RunBlock(block, {x}));
    x = out[0];
  }
  return x;
}

}  // namespace qualification
}  // namespace lockstep
