// trainer/trainer_config.h
//
// The values TrainerRank (trainer_rank.h) takes and hands back: the DP rank's batch
// (TrainerInputs), one microbatch's full outputs (MicrobatchOutput) and the trainer's
// configuration (TrainerConfig), including the collaborators it shares with the caller — memory
// probe, ledger — held by shared ownership, so that none of them can be destroyed while the
// trainer uses it.
//
// Thread-safety: plain values.

#ifndef LOCKSTEP_TRAINER_TRAINER_CONFIG_H_
#define LOCKSTEP_TRAINER_TRAINER_CONFIG_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "admission/ledger.h"
#include "admission/memory_model.h"
#include "admission/memory_probe.h"
#include "numerics/named_tensors.h"
#include "planner/plan.pb.h"
#include "planner/planner.h"

namespace lockstep {
namespace trainer {

// A DP rank's batch: its sequences and, row by row, the caller's per-token inputs (sequence 0's
// tokens first, then sequence 1's, ...), materialised under the caller's RNG.
struct TrainerInputs {
  static TrainerInputs Of(std::vector<planner::Sequence> sequences, at::Tensor rows) {
    TrainerInputs inputs;
    inputs.sequences = std::move(sequences);
    inputs.rows = std::move(rows);
    return inputs;
  }
  std::vector<planner::Sequence> sequences;
  // [total tokens, ...]; its first dimension must equal the sequences' token count.
  at::Tensor rows;
};

// Builds a custom object's parameters (TrainerRank::RegisterCustomObject), named: the names are
// compared across the replicas with the rest of the structure.
using CustomObjectFactory = std::function<absl::StatusOr<numerics::NamedTensors>()>;

// One microbatch's full outputs, as every replica receives them.
struct MicrobatchOutput {
  int microbatch = 0;
  // [tokens, ...] in packed order.
  at::Tensor outputs;
  // int64 [tokens]: the row of TrainerInputs.rows each output row belongs to.
  at::Tensor input_rows;
  // float64 [tokens]: the planner's loss weight of each token (caller weight x loss scale).
  at::Tensor loss_weights;
};

struct TrainerConfig {
  static TrainerConfig Of(int64_t max_tokens_per_microbatch) {
    TrainerConfig config;
    config.max_tokens_per_microbatch = max_tokens_per_microbatch;
    return config;
  }
  int64_t max_tokens_per_microbatch = 0;
  planner::PackingPolicy packing = planner::PACKING_FIRST_FIT_DECREASING;
  planner::LossNormalization loss_normalization = planner::LOSS_TOKEN_MEAN;

  // Admission and out-of-memory recovery (admission/recovery_loop.h), on when `memory_model` is
  // given (the same on every replica; the trainer keeps its own copy, which it corrects after
  // out of memory: TrainerRank::memory_model()). Every planned microbatch must be predicted to fit
  // under `memory_cap_bytes` — ForwardAllMicrobatches adding what the microbatches before it keep
  // held until the hand-back (MemoryModel::PredictRetained) — else the call is refused naming it.
  // A forward that ran out of memory on any replica is discarded on all of them (the model stream
  // rewound to where the attempt began, cached memory released through `memory_probe` if given,
  // the model corrected) and its microbatch split with planner::SplitMicrobatch and retried, up
  // to `max_split_depth` halvings; the halves are then yielded as separate microbatches. No
  // gradient is involved: the caller's backward runs after the hand-back.
  std::optional<admission::MemoryModel> memory_model;
  int64_t memory_cap_bytes = 0;
  std::shared_ptr<admission::MemoryProbe> memory_probe;
  int max_split_depth = 4;

  // The rank's recovery ledger (admission/ledger.h), optional; each process writes its own. Every
  // ForwardMicrobatches/ForwardAllMicrobatches call is one ledger step (numbered on from the last
  // step the ledger began): its plan is recorded, every attempt at a microbatch as admitted and
  // started (once the model's forward returned), an attempt that failed as failed (and split,
  // halves "m.0" and "m.1", after out of memory), a microbatch as completed once its outputs are
  // handed back, and the step committed (fsynced, per LedgerOptions) when the call's last
  // microbatch has been handed back. The writes are queued (Note [Queued ledger writes] in
  // ledger.h): a crash loses the writes still queued, never part of one. SaveState waits until
  // every write is written and durable; a caller that persists its own state (its accumulated
  // gradients, say) calls ledger->AwaitDurable() first. A call that ends early (an error, a
  // crash, a stream not read to its end) leaves its step open: Ledger::Replay then names the
  // microbatches of it the caller received, and the trainer refuses to begin another step
  // (kFailedPrecondition naming the open one) until the caller continues on a new ledger file.
  std::shared_ptr<admission::Ledger> ledger;

  // Activation checkpointing of the blocks a model runs through ShardWork::RunBlock: their
  // activations are recomputed in backward, with the forward's randomness replayed. Default: off.
  bool activation_checkpointing = false;
};

}  // namespace trainer
}  // namespace lockstep

#endif  // LOCKSTEP_TRAINER_TRAINER_CONFIG_H_
