// trainer/qualification/reference_model.h
//
// ReferenceModel: a small model for the trainer's oracle, runnable unsplit (the reference) and
// split over TP and CP. Per token: out = x + RowParallel(Dropout(GELU(ColumnParallel(x)))), where
// the column-parallel weight W1 [hidden, width] and the row-parallel W2 [width, hidden] are
// sharded over the TP group (W1 by rows, W2 by columns), the row-parallel partial sums are
// all-reduced over TP with a differentiable all-reduce (forward: sum; backward: identity, as the
// loss is replicated), and dropout is partition-invariant Philox (rng/philox.h) keyed by a seed
// drawn from the model stream each forward and indexed by (sequence id, position, hidden unit),
// so masks are the same bit for bit however the tokens and units are split. The full weights are
// fixed functions of their indices, so every split holds slices of the same model.
//
// The loss head is not part of it: the oracle registers one through
// TrainerRank::RegisterCustomObject.
//
// Thread-safety: one thread at a time.

#ifndef LOCKSTEP_TRAINER_QUALIFICATION_REFERENCE_MODEL_H_
#define LOCKSTEP_TRAINER_QUALIFICATION_REFERENCE_MODEL_H_

#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "c10/core/Device.h"
#include "collectives/communicator.h"
#include "trainer/trainer_rank.h"

namespace lockstep {
namespace trainer {

class ReferenceModel {
 public:
  static constexpr int64_t kWidth = 8;    // input/output features
  static constexpr int64_t kHidden = 16;  // hidden units, split over TP
  static constexpr double kDropout = 0.25;

  // The model's shard for TP rank `tp_rank` of `tp_size` (1: the whole model); `tp_group` is
  // the TP group (nullptr when tp_size is 1). kInvalidArgument if kHidden does not split evenly.
  // Its tensors live on `device` (CPU, or a CUDA device in --config=cuda builds); the dropout
  // seed is drawn from that device's default generator (the model stream inside the scope).
  static absl::StatusOr<ReferenceModel> Create(int tp_rank, int tp_size,
                                               collectives::Communicator* tp_group,
                                               c10::Device device = c10::Device(c10::kCPU));

  // The forward of a shard (a TrainerRank ForwardAdapter). Draws the dropout seed from the live
  // generator (the model stream, inside TrainerRank's scope).
  absl::StatusOr<at::Tensor> Forward(const ShardWork& work);

  // W1's and W2's shards (parameters).
  std::vector<at::Tensor> parameters() const { return {w1_, w2_}; }
  // The full-model slice this shard corresponds to: rows of W1 / columns of W2.
  int64_t hidden_begin() const { return hidden_begin_; }
  int64_t hidden_end() const { return hidden_begin_ + w1_.size(0); }

 private:
  ReferenceModel(at::Tensor w1, at::Tensor w2, int64_t hidden_begin,
                 collectives::Communicator* tp_group)
      : w1_(std::move(w1)), w2_(std::move(w2)), hidden_begin_(hidden_begin), tp_group_(tp_group) {}
  at::Tensor w1_;
  at::Tensor w2_;
  int64_t hidden_begin_;
  collectives::Communicator* tp_group_;
};

}  // namespace trainer
}  // namespace lockstep

#endif  // LOCKSTEP_TRAINER_QUALIFICATION_REFERENCE_MODEL_H_
