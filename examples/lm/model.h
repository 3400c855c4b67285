// examples/lm/model.h
//
// TinyLm: a small decoder-only transformer language model over bytes, written the way a lockstep
// user writes a model that is split over tensor parallelism (TP) and context parallelism (CP):
// token and position embeddings, blocks of pre-norm causal self-attention and MLP, and an output
// head tied to the token embedding.
//
// How each part is split, and why:
// - Every rank holds the whole embeddings, norms and attention; the MLP is split over TP, its
//   first layer by rows (column-parallel) and its second by columns (row-parallel), with
//   collectives::CopyToGroup before and ReduceFromGroup after, as in Megatron.
// - Attention runs on this CP rank's shard of the microbatch (trainer::ShardWork): its queries
//   are the shard's tokens, its keys and values those of every CP rank (collectives::GatherRows
//   over the CP group), masked causally by each token's sequence and position
//   (ShardWork::sequence_ids, ShardWork::positions), so a sequence split over CP ranks attends
//   exactly as it would unsplit.
// - Dropout in the MLP is partition-invariant (rng::PartitionedDropoutMask): each element's keep
//   decision is a function of (seed, step, block, the token's sequence id and position, the hidden
//   unit), never of which rank computes it — so any DP x TP x CP layout trains the same model.
// - Each block runs through ShardWork::RunBlock: with activation checkpointing its activations
//   are recomputed in backward (its collectives run again, in the same order on every rank).
//
// - Under placement-invariant mode (invariant/mode.h, read when Forward starts) every layer runs
//   the mode's kernels (invariant/ops.h: embeddings, layer norms, linear layers, GELU, attention
//   over each sequence's own keys, per head), so a sequence's logits are the same bits alone,
//   packed with others or sharded over CP; with UseExactGradients, every weight's gradient is
//   summed exactly there (Note [Exact accumulation]). The TP split's ReduceFromGroup still sums
//   partial products in floating point: under TP > 1 the mode's bits are TP-size dependent.
//
// The weights are drawn from the model's own seeded generator, whole, and each rank keeps its TP
// shard, so every layout starts from the same model (and the caller's RNG is not touched).
//
// Thread-safety: one thread.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(TinyLm model, TinyLm::Create(TinyLmConfig(), tp_rank, tp_size,
//                                                          tp_group, cp_group, device));
//   ... TrainerRank::Create(config, collaborators,
//           [&](const trainer::ShardWork& work) { return model.Forward(work, step); });

#ifndef LOCKSTEP_EXAMPLES_LM_MODEL_H_
#define LOCKSTEP_EXAMPLES_LM_MODEL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "c10/core/Device.h"
#include "collectives/communicator.h"
#include "invariant/exact_gradients.h"
#include "invariant/ops.h"
#include "numerics/named_tensors.h"
#include "trainer/shard_work.h"

namespace lockstep {
namespace examples {

struct TinyLmConfig {
  int64_t vocab = 256;  // bytes
  int64_t width = 32;   // model width
  int64_t heads = 2;    // attention heads (width / heads each)
  int64_t hidden = 64;  // MLP hidden units, split over TP
  int64_t blocks = 2;
  int64_t max_positions = 64;  // the longest sequence
  double dropout = 0.1;        // MLP dropout
  uint64_t seed = 1;           // weights and dropout
};

class TinyLm {
 public:
  // The model's shard for TP rank `tp_rank` of `tp_size`. `tp_group` and `cp_group` are this
  // rank's TP and CP groups (nullptr for a group of one). kInvalidArgument when the hidden units
  // do not split over TP or the width over the heads.
  static absl::StatusOr<TinyLm> Create(const TinyLmConfig& config, int tp_rank, int tp_size,
                                       collectives::Communicator* tp_group,
                                       collectives::Communicator* cp_group, c10::Device device);

  // The forward adapter: logits [n, vocab] of the shard's n tokens (work.inputs: int64 token ids
  // [n]) at training step `step` (which keys the dropout). Collective over the TP and CP groups.
  absl::StatusOr<at::Tensor> Forward(const trainer::ShardWork& work, int64_t step) const;

  // Every parameter by name: whole for the replicated ones, this rank's shard for "block<b>.w1"
  // and "block<b>.w2".
  const numerics::NamedTensors& parameters() const { return parameters_; }

  // Under placement-invariant mode, every weight's gradient goes to `exact` (whose parameters
  // are this model's, by name) instead of autograd's .grad. Null: .grad.
  // Precondition: `exact` outlives every backward of a Forward made after this call.
  void UseExactGradients(invariant::ExactGradients* exact) { exact_ = exact; }

  // Whether parameter `name` is split over TP (its gradient is this rank's shard's alone).
  static bool SplitOverTp(const std::string& name);

 private:
  TinyLm(TinyLmConfig config, numerics::NamedTensors parameters, int tp_rank, int tp_size,
         collectives::Communicator* tp_group, collectives::Communicator* cp_group)
      : config_(config),
        parameters_(std::move(parameters)),
        tp_rank_(tp_rank),
        tp_size_(tp_size),
        tp_group_(tp_group),
        cp_group_(cp_group) {}

  const at::Tensor& Parameter(const std::string& name) const;
  // The MLP's partition-invariant dropout of this TP rank's hidden units (scaled).
  at::Tensor Dropout(const at::Tensor& hidden_units, const at::Tensor& ids,
                     const at::Tensor& positions, int64_t block, int64_t step) const;
  // Under the mode: block `p`'s attention of `h` (tokens: the shard's (sequence id, position)),
  // and its MLP's partial product on this TP rank (throw, as a block does, on failure).
  at::Tensor InvariantAttention(const std::string& p, const at::Tensor& h, const at::Tensor& tokens,
                                int64_t widest,
                                const std::map<std::string, invariant::WeightGradient>& to) const;
  at::Tensor InvariantMlp(const std::string& p, const at::Tensor& after_attention,
                          const at::Tensor& ids, const at::Tensor& positions, int64_t block,
                          int64_t step,
                          const std::map<std::string, invariant::WeightGradient>& to) const;
  // Where parameter `name`'s gradient goes under the mode.
  absl::StatusOr<invariant::WeightGradient> GradientOf(const std::string& name) const;

  TinyLmConfig config_;
  numerics::NamedTensors parameters_;
  int tp_rank_, tp_size_;
  collectives::Communicator* tp_group_;
  collectives::Communicator* cp_group_;
  invariant::ExactGradients* exact_ = nullptr;
};

}  // namespace examples
}  // namespace lockstep

#endif  // LOCKSTEP_EXAMPLES_LM_MODEL_H_
