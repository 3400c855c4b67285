// trainer/trainer_config.h
//
// The values TrainerRank (trainer_rank.h) takes and hands back: the DP rank's batch
// (TrainerInputs), one microbatch's full outputs (MicrobatchOutput), the trainer's configuration
// (TrainerConfig, a value) and the resources it shares with the caller (Collaborators: groups,
// streams, memory probe, ledger).
//
// Thread-safety: plain values.

#ifndef LOCKSTEP_TRAINER_TRAINER_CONFIG_H_
#define LOCKSTEP_TRAINER_TRAINER_CONFIG_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "admission/ledger.h"
#include "admission/memory_model.h"
#include "admission/memory_probe.h"
#include "admission/recovery_loop.h"
#include "collectives/communicator.h"
#include "collectives/topology.h"
#include "numerics/named_tensors.h"
#include "planner/plan.pb.h"
#include "planner/planner.h"
#include "rng/rank_streams.h"

namespace lockstep {
namespace trainer {

// A DP rank's batch: its sequences and, row by row, the caller's per-token inputs (sequence 0's
// tokens first, then sequence 1's, ...), materialised under the caller's RNG.
struct TrainerInputs {
  // The batch of `sequences` with their input `rows`.
  static TrainerInputs Of(std::vector<planner::Sequence> sequences, at::Tensor rows) {
    TrainerInputs inputs;
    inputs.sequences = std::move(sequences);
    inputs.rows = std::move(rows);
    return inputs;
  }
  // The batch's sequences, in the order of their rows in `rows`.
  std::vector<planner::Sequence> sequences;
  // [total tokens, ...]; its first dimension must equal the sequences' token count.
  at::Tensor rows;
};

// Builds a custom object's parameters (TrainerRank::RegisterCustomObject), named: the names are
// compared across the replicas with the rest of the structure.
using CustomObjectFactory = std::function<absl::StatusOr<numerics::NamedTensors>()>;

// One microbatch's full outputs, as every replica receives them.
struct MicrobatchOutput {
  // Index of the microbatch in the step's plan (as split by out-of-memory recovery).
  int microbatch = 0;
  // [tokens, ...] in packed order.
  at::Tensor outputs;
  // int64 [tokens]: the row of TrainerInputs.rows each output row belongs to.
  at::Tensor input_rows;
  // float64 [tokens]: the planner's loss weight of each token (caller weight x loss scale).
  at::Tensor loss_weights;
};

// The trainer's configuration: a pure value, the same on every replica of a job, nesting the
// options it passes on; Canonical() is what replicas compare to agree on it (a program checks it
// with collectives::CheckAgreement). What the trainer uses but does not own is in Collaborators.
struct TrainerConfig {
  // The configuration for a budget of `max_tokens_per_microbatch` tokens, with the defaults
  // below for the rest.
  static TrainerConfig Of(int64_t max_tokens_per_microbatch) {
    TrainerConfig config;
    config.plan = planner::PlanOptions::Of(max_tokens_per_microbatch);
    return config;
  }

  // How each DP batch is planned (planner/planner.h): the token budget (at least 2 x the CP
  // size), packing and loss normalization. plan.cp_size is not read: the trainer plans for its
  // topology's CP size. Default: PlanOptions' defaults with no budget (Of sets it).
  planner::PlanOptions plan;

  // Admission and out-of-memory recovery (admission/recovery_loop.h), on when `memory_model` is
  // given (the same on every replica; the trainer keeps its own copy, which it corrects after
  // out of memory: TrainerRank::memory_model()). Every planned microbatch must be predicted to fit
  // under `memory_cap_bytes` — ForwardAllMicrobatches adding what the microbatches before it keep
  // held until the hand-back (MemoryModel::PredictRetained) — else the call is refused naming it.
  // A forward that ran out of memory on any replica is discarded on all of them (the model stream
  // rewound to where the attempt began, cached memory released through the collaborators'
  // memory probe if given, the model corrected) and its microbatch split with
  // planner::SplitMicrobatch and retried, up to `recovery.max_split_depth` halvings; the halves
  // are then yielded as separate microbatches. No gradient is involved: the caller's backward runs
  // after the hand-back. Default: off.
  std::optional<admission::MemoryModel> memory_model;
  // The memory cap in bytes; with a memory model it must be > 0 (Create refuses it otherwise).
  // Default: 0.
  int64_t memory_cap_bytes = 0;
  // recovery.max_split_depth as above (default 4). recovery.admission is not read: the trainer
  // admits one microbatch per wave, its outputs held until the end for ForwardAllMicrobatches.
  admission::RecoveryOptions recovery;

  // Activation checkpointing of the blocks a model runs through ShardWork::RunBlock: their
  // activations are recomputed in backward, with the forward's randomness replayed. Default: off.
  bool activation_checkpointing = false;

  // Every field the trainer reads, as text in one fixed order ("plan.max_tokens_per_microbatch=
  // 64;..."): equal configurations give equal text, so replicas compare it (or its digest).
  std::string Canonical() const;
};

// What a TrainerRank uses but does not own, each held by shared ownership so that none of them
// can be destroyed while the trainer uses it.
struct Collaborators {
  // The required collaborators: the job's topology, this rank's global rank, its TP x CP group
  // and its streams; no memory probe, no ledger.
  static Collaborators Of(collectives::Topology topology, int world_rank,
                          std::shared_ptr<collectives::Communicator> tp_cp_group,
                          std::shared_ptr<rng::RankStreams> streams) {
    Collaborators collaborators(std::move(topology));
    collaborators.world_rank = world_rank;
    collaborators.tp_cp_group = std::move(tp_cp_group);
    collaborators.streams = std::move(streams);
    return collaborators;
  }
  // The job's DP x TP x CP topology.
  collectives::Topology topology;
  // This rank's global rank in `topology`.
  int world_rank = 0;
  // The rank's TP x CP group (topology.TpCpGroup(world_rank)); nullptr only for a world of one.
  std::shared_ptr<collectives::Communicator> tp_cp_group;
  // The rank's RNG streams (the caller's generators, the model stream, named streams); required.
  std::shared_ptr<rng::RankStreams> streams;

  // Releases cached device memory after out of memory and reads the peak of each attempt
  // (TrainerConfig::memory_model). Optional.
  std::shared_ptr<admission::MemoryProbe> memory_probe;

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

 private:
  explicit Collaborators(collectives::Topology topology) : topology(std::move(topology)) {}
};

}  // namespace trainer
}  // namespace lockstep

#endif  // LOCKSTEP_TRAINER_TRAINER_CONFIG_H_
