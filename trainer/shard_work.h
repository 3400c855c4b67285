// trainer/shard_work.h
//
// ShardWork is what a model's forward adapter receives from TrainerRank (trainer_rank.h): one
// microbatch of the plan, this rank's CP shard of it — the caller's input rows of the shard's
// tokens and, on request, each token's place in the packed microbatch, its sequence and its
// position — and RunBlock, which runs one block of the model through an activation checkpoint
// when the trainer is configured to.
//
// Thread-safety: a ShardWork is used by the forward that received it, on the thread that called
// it; it does not outlive that call.
//
// Example (a forward adapter):
//   [&](const trainer::ShardWork& work) -> absl::StatusOr<at::Tensor> {
//     at::Tensor x = embedding(work.inputs, work.positions());
//     LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> out, work.RunBlock(block, {x}));
//     return head(out[0]);
//   }

#ifndef LOCKSTEP_TRAINER_SHARD_WORK_H_
#define LOCKSTEP_TRAINER_SHARD_WORK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.h"
#include "planner/plan.pb.h"
#include "planner/planner.h"

namespace lockstep {
namespace trainer {

namespace internal {
class TrainerCore;
}  // namespace internal

// What the model's forward receives: one microbatch, this rank's CP shard of it.
struct ShardWork {
  // One block of the model: activations in, activations out. It reports errors by throwing
  // (LibTorch's exceptions; lockstep::ThrowAsTorchError for a status).
  using Block = checkpoint::CheckpointedFunction;

  // The step's plan (as split so far), owned by the trainer; valid during the forward call.
  const planner::Plan* plan = nullptr;
  // Index of this microbatch in `plan`'s microbatches.
  int microbatch = 0;
  // This rank's CP coordinate: which shard of the microbatch it holds, in [0, cp_size).
  int cp_rank = 0;
  // The topology's CP size: the number of shards of the microbatch.
  int cp_size = 1;
  // Forward calls of this TrainerRank so far (0 for the first microbatch it runs; an attempt that
  // failed does not count).
  int64_t forward_index = 0;
  // The caller's input rows of the shard's n tokens ([n, ...], n may be 0): a view of
  // TrainerInputs::rows when they are one run of rows, else a copy.
  at::Tensor inputs;
  // The most tokens any CP rank holds in this microbatch, so that a model's collectives over the
  // CP group (an all-gather of keys and values) can pad every shard to one size.
  int64_t widest_shard = 0;

  // Runs `block` on `inputs`. With TrainerConfig::activation_checkpointing on, through
  // checkpoint::Checkpoint over the rank's streams: its activations are dropped after the forward
  // and recomputed in backward with the forward's randomness (model stream and named streams)
  // replayed, the caller's streams restored after; the block's collectives then run again in
  // backward, in the same order on every rank. Off: the block runs directly. Errors (thrown by
  // the block, or the checkpoint's own) come back as statuses.
  absl::StatusOr<std::vector<at::Tensor>> RunBlock(const Block& block,
                                                   const std::vector<at::Tensor>& inputs) const;

  // The shard's tokens as ranges of the microbatch's packed buffer (a few per packed sequence, in
  // packed order; ShardPieces of the plan). `inputs` holds their rows in this order.
  const std::vector<planner::ShardPiece>& pieces() const { return pieces_; }
  // Per token of the shard, in `inputs`' order (int64 [n], CPU): its offset in the packed buffer,
  // the caller's id of its sequence, its position in that sequence. Each is built from the pieces
  // on its first call and kept, so a forward that does not read one does not wait for it. Throws
  // c10::Error if the tensor cannot be allocated (the trainer reports it as the forward's
  // status). Not thread-safe.
  const at::Tensor& packed_offsets() const;
  // Per token of the shard (int64 [n], CPU): the caller's id of its sequence (see above).
  const at::Tensor& sequence_ids() const;
  // Per token of the shard (int64 [n], CPU): its position in its sequence, 0-based (see above).
  const at::Tensor& positions() const;

 private:
  friend class internal::TrainerCore;
  // One int64 per token: `first(piece)` for a piece's first token, then the same (counting
  // false) or one more per token (counting true).
  template <typename First>
  at::Tensor PerToken(const First& first, bool counting) const;

  std::vector<planner::ShardPiece> pieces_;
  mutable at::Tensor packed_offsets_, sequence_ids_, positions_;
  // The recompute's stream saver; null when activation checkpointing is off.
  std::shared_ptr<const checkpoint::RngStateSaver> recompute_streams_;
};

// The model's forward on a shard: returns [n, ...] outputs for the shard's n tokens (same
// trailing shape on every rank), differentiable into the model's parameters.
using ForwardAdapter = std::function<absl::StatusOr<at::Tensor>(const ShardWork&)>;

}  // namespace trainer
}  // namespace lockstep

#endif  // LOCKSTEP_TRAINER_SHARD_WORK_H_
