// qualification/reference_model.h
//
// ReferenceModel: a small transformer-shaped model for the trainer's oracle, runnable unsplit
// (the reference) and split over TP and CP, with the same parameters either way:
//   x = Embedding[token id]                                    (replicated)
//   kBlocks times, each block one ShardWork::RunBlock (so activation checkpointing applies):
//     x = x + Attention(x)   causal within each sequence; with CP, over keys and values
//                            all-gathered from the CP group (GatherRows: the planner's shards,
//                            padded to the widest), so every query sees its whole sequence
//     x = x + RowParallel(Dropout(GELU(ColumnParallel(CopyToGroup(x)))))  reduced over TP
//                            (ReduceFromGroup); W1 [hidden, width] split by rows and W2
//                            [width, hidden] by columns over the TP group
// Dropout is partition-invariant Philox (rng/philox.h) keyed by a seed each block draws from the
// model stream and indexed by (sequence id, position, hidden unit), so masks are the same bit for
// bit however tokens and units are split, and a recomputed block (activation checkpointing)
// draws the same seed again. The embedding and attention weights are replicated over TP (their
// gradients agree across TP ranks); every parameter's gradient is partial over CP (each CP rank
// back-propagates its own tokens' outputs) and sums to the unsplit gradient.
//
// Every weight is a fixed function of its indices (no RNG), so every split holds slices of the
// same model. The loss head is not part of it: the oracle registers one through
// TrainerRank::RegisterCustomObject.
//
// Thread-safety: one thread at a time. The groups must outlive the model and every backward
// through its outputs (backward runs its collectives).

#ifndef LOCKSTEP_QUALIFICATION_REFERENCE_MODEL_H_
#define LOCKSTEP_QUALIFICATION_REFERENCE_MODEL_H_

#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "c10/core/Device.h"
#include "collectives/communicator.h"
#include "invariant/exact_gradients.h"
#include "numerics/named_tensors.h"
#include "rng/rank_streams.h"
#include "trainer/trainer_rank.h"

namespace lockstep {
namespace qualification {

// Observes the reference model's modules, in execution order: "embedding", then per block
// "block<b>.attention" and "block<b>.mlp" (the variability checks tap them with a
// numerics::Recorder and with per-sequence probes). Each call returns the tensor the model goes
// on with. `sequence_ids` and `positions` (CPU int64 [n]) name the rows of the shard's tensors.
class ModuleTaps {
 public:
  virtual ~ModuleTaps() = default;
  // Before `module` runs, with its input.
  virtual at::Tensor Enter(const std::string& module, const at::Tensor& input) = 0;
  // After `module` ran, with its output.
  virtual at::Tensor Exit(const std::string& module, const at::Tensor& output,
                          const at::Tensor& sequence_ids, const at::Tensor& positions) = 0;
};

class ReferenceModel {
 public:
  static constexpr int64_t kVocab = 64;   // token ids are in [0, kVocab)
  static constexpr int64_t kWidth = 8;    // model width (outputs per token)
  static constexpr int64_t kHidden = 16;  // MLP hidden units, split over TP
  static constexpr int kBlocks = 2;
  static constexpr double kDropout = 0.25;

  // The model's shard for TP rank `tp_rank` of `tp_size` (1: the whole model) and a CP group of
  // `cp_group` (nullptr: no CP). `tp_group` is the TP group (nullptr exactly when tp_size is 1).
  // kInvalidArgument if kHidden does not split evenly or the groups do not fit the sizes. Its
  // tensors live on `device` (CPU, or a CUDA device in --config=cuda builds); dropout seeds are
  // drawn from that device's default generator (the model stream inside TrainerRank's scope).
  static absl::StatusOr<ReferenceModel> Create(int tp_rank, int tp_size,
                                               collectives::Communicator* tp_group,
                                               collectives::Communicator* cp_group,
                                               c10::Device device = c10::Device(c10::kCPU));

  // The forward of a shard (a TrainerRank ForwardAdapter): work.inputs holds the shard's token
  // ids (int64 [n]); returns [n, kWidth]. Collective over the TP and CP groups.
  absl::StatusOr<at::Tensor> Forward(const trainer::ShardWork& work);

  // Makes every forward draw one scale factor for its embeddings from the named stream `name` of
  // `streams` (rng/named_streams.h), which must exist. Every replica, and the unsplit reference,
  // runs the same forwards, so they draw the same factors; the stream is part of what a resume
  // must restore (the oracle's resume check). Default: no named stream.
  void DrawFromNamedStream(std::shared_ptr<rng::RankStreams> streams, std::string name) {
    named_streams_ = std::move(streams);
    named_stream_ = std::move(name);
  }

  // Taps every module (see ModuleTaps) until replaced; nullptr: none (the default). Modules
  // checkpointed with ShardWork::RunBlock are tapped again when recomputed.
  void SetTaps(std::shared_ptr<ModuleTaps> taps) { taps_ = std::move(taps); }

  // Drops dropout (every unit kept, no rescaling): what a check of numerics alone needs, since
  // each forward draws its blocks' dropout seeds afresh and a sequence forwarded in another
  // microbatch would otherwise get another mask. Default: dropout on.
  void DisableDropout() { dropout_ = false; }

  // Wrong split arithmetic, for the negative controls of reference_match. Planted in the model
  // itself, so the unsplit reference runs the same code, where each is a no-op (no CP group, no
  // TP group): a difference from the reference is the split's alone.
  enum class SplitBug {
    kNone,
    // Attention over this CP rank's own keys only: the keys, values and their tokens are not
    // gathered from the CP group.
    kCpLocalAttention,
    // The TP-split MLP's input not reduced over the TP group in backward (CopyToGroup skipped):
    // the forward is unchanged, each TP rank keeps only its partial gradient.
    kTpUnreducedGradient,
  };
  // Plants `bug` in every later forward. Default: kNone.
  void BreakSplitArithmetic(SplitBug bug) { split_bug_ = bug; }

  // Under placement-invariant mode (invariant/mode.h) the model runs invariant/ops.h's kernels:
  // Linear for every product, Gelu, and SequenceAttention over each sequence's own keys. This
  // negative control swaps LibTorch's masked softmax over every key of the microbatch back in
  // for the attention, the rest of the mode kept. Default: off.
  void UseLibTorchAttention() { libtorch_attention_ = true; }

  // Under placement-invariant mode, where the parameters' gradients go: `exact`'s sums (Note
  // [Exact accumulation] in invariant/exact_gradients.h; its slots named as parameters()), or,
  // null, autograd's .grad. Precondition: `exact` outlives the backward of every forward run
  // while it is set. Default: null.
  void SetExactGradients(std::shared_ptr<invariant::ExactGradients> exact) {
    exact_ = std::move(exact);
  }

  // The negative control of the variability checks: `module` (a ModuleTaps name) adds to its
  // output the rounding residue of a reduction whose order changes from call to call, so the
  // model is no longer deterministic there (Note [Deliberate nondeterminism] in
  // reference_model.cc). kInvalidArgument for a name that is not one of the model's modules.
  absl::Status BreakDeterminismAt(const std::string& module);

  // The model's module names, in execution order.
  static std::vector<std::string> ModuleNames();

  // The shard's parameters by name ("embedding", "block<b>.wq", ... "block<b>.w2").
  const numerics::NamedTensors& parameters() const { return parameters_; }

  // The part of the full model's tensor `full` of parameter `name` that TP rank `tp_rank` of
  // `tp_size` holds: rows [begin, end) of W1, columns of W2, all of a replicated one.
  static absl::StatusOr<at::Tensor> ShardOf(const std::string& name, const at::Tensor& full,
                                            int tp_rank, int tp_size);

 private:
  ReferenceModel(numerics::NamedTensors parameters, int tp_rank, int tp_size,
                 collectives::Communicator* tp_group, collectives::Communicator* cp_group)
      : parameters_(std::move(parameters)),
        tp_rank_(tp_rank),
        tp_size_(tp_size),
        tp_group_(tp_group),
        cp_group_(cp_group) {}

  std::shared_ptr<rng::RankStreams> named_streams_;
  std::string named_stream_;
  std::shared_ptr<ModuleTaps> taps_;
  bool dropout_ = true;
  std::string broken_module_;
  SplitBug split_bug_ = SplitBug::kNone;
  bool libtorch_attention_ = false;
  std::shared_ptr<invariant::ExactGradients> exact_;

  at::Tensor Enter(const std::string& module, const at::Tensor& input) const {
    return taps_ != nullptr ? taps_->Enter(module, input) : input;
  }
  // Taps `module`'s output, after adding the deliberate nondeterminism if it is the broken one.
  at::Tensor Exit(const std::string& module, at::Tensor output, const at::Tensor& ids,
                  const at::Tensor& positions);

  // Block `block`'s weight `which` (the .cc's BlockWeight order: wq, wk, wv, wo, w1, w2).
  const at::Tensor& Weight(int block, int which) const;

  numerics::NamedTensors parameters_;
  int tp_rank_;
  int tp_size_;
  collectives::Communicator* tp_group_;
  collectives::Communicator* cp_group_;
};

}  // namespace qualification
}  // namespace lockstep

#endif  // LOCKSTEP_QUALIFICATION_REFERENCE_MODEL_H_
