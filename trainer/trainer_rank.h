// trainer/trainer_rank.h
//
// TrainerRank: the rank-local trainer core. It composes planner (plans and their agreement),
// rng (the rank's streams, model-stream scopes, synchronization), collectives (the TP x CP group)
// and admission (waves under a memory cap) behind one object that a LibTorch program adopts by
// one Bazel label (//trainer:trainer_rank). The caller owns the model's loss, backward, optimizer
// step, DP partitioning and accumulation boundaries; TrainerRank runs the model's forward on
// this rank's CP shard of each planned microbatch and hands every TP/CP replica the full
// outputs.
//
// RNG contract (SPEC "trainer"):
// - The caller's inputs are materialised under the caller's RNG before they are given here; no
//   library work happens before.
// - Planning and the model's forward run inside the model-stream scope (rng/model_stream.h);
//   the scope never spans a hand-back to the caller. For a MicrobatchStream it ends once the
//   microbatch's forward is queued and the group agreed on its outcome: the gather and the
//   assembly of the outputs that follow draw no random numbers.
// - After each hand-back point — each microbatch a MicrobatchStream yields, each DpRankForward
//   return — the caller's RNG state is synchronized across the TP x CP group (its leader's state
//   wins), so the caller's draws (token masks, a custom head's dropout) agree on every replica.
//   A MicrobatchStream synchronizes as soon as its scope has ended (before the gather, while the
//   forward's kernels run); nothing draws from the caller's state between then and the hand-back.
// - Create synchronizes first, so the model stream, derived from the caller's state at the first
//   scope, agrees across the replicas too (ART derives it from each replica's unsynchronized
//   state).
// - RegisterCustomObject checks the replicas agree on the registration, synchronizes, runs the
//   caller's factory, and broadcasts the parameters it returns from the group's leader.
//
// Collectives: every replica runs the same collectives in the same order; a rank whose CP shard
// of a microbatch is empty still joins the gather (it contributes padding). Errors from any
// module reach the caller as statuses with the rank, microbatch and operation; a dead peer is the
// communicator's error within its timeout, never a hang.
//
// Outputs: MicrobatchOutput.outputs holds the microbatch's tokens in packed order; rows gathered
// from other CP ranks are constants, the rank's own rows are differentiable into the model, so
// a loss computed identically on every replica back-propagates each replica's share exactly
// once (sum parameter gradients over the CP group, as for any CP-sharded model).
//
// Thread-safety: one thread uses a TrainerRank (and its streams) at a time.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(auto trainer, trainer::TrainerRank::Create(
//       trainer::TrainerConfig::Of(/*max_tokens_per_microbatch=*/8192),
//       trainer::TrainerRank::Collaborators::Of(topology, world_rank, tp_cp_group, streams),
//       [&](const trainer::ShardWork& work) { return model.Forward(work); }));
//   LOCKSTEP_ASSIGN_OR_RETURN(auto stream, trainer->ForwardMicroBatches(inputs));
//   while (true) {
//     LOCKSTEP_ASSIGN_OR_RETURN(std::optional<trainer::MicrobatchOutput> out, stream.Next());
//     if (!out) break;
//     Loss(*out).backward();   // caller's RNG: agrees on every replica
//   }

#ifndef LOCKSTEP_TRAINER_TRAINER_RANK_H_
#define LOCKSTEP_TRAINER_TRAINER_RANK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "admission/ledger.h"
#include "admission/memory_model.h"
#include "admission/memory_probe.h"
#include "c10/core/Stream.h"
#include "checkpoint/checkpoint.h"
#include "collectives/communicator.h"
#include "collectives/topology.h"
#include "numerics/named_tensors.h"
#include "planner/plan.pb.h"
#include "planner/planner.h"
#include "rng/rank_streams.h"

namespace torch {
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

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

// What the model's forward receives: one microbatch, this rank's CP shard of it.
struct ShardWork {
  // One block of the model: activations in, activations out. It reports errors by throwing
  // (LibTorch's exceptions; lockstep::ThrowAsTorchError for a status).
  using Block = checkpoint::CheckpointedFunction;

  const planner::Plan* plan = nullptr;
  int microbatch = 0;
  int cp_rank = 0;
  int cp_size = 1;
  // Forward calls of this TrainerRank so far (0 for the first microbatch it runs).
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
  // on its first call and kept: a forward that does not read one does not wait for it (~70 us per
  // 65,536 tokens on an H200 host, before the model could start). Throws c10::Error if the
  // tensor cannot be allocated (the trainer reports it as the forward's status). Not thread-safe.
  const at::Tensor& packed_offsets() const;
  const at::Tensor& sequence_ids() const;
  const at::Tensor& positions() const;

 private:
  friend class TrainerRank;
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
  // Admission and out-of-memory recovery (admission/), on when `memory_model` is given (it must
  // be the same on every replica and outlive the trainer): every planned microbatch must be
  // predicted to fit under `memory_cap_bytes` (else ForwardMicroBatches/DpRankForward refuse,
  // naming it); after each forward the group agrees on the outcome (one small all-reduce) before
  // the gather, and a forward that ran out of memory on any replica is discarded on all of them
  // (the model stream rewound to where the attempt began, cached memory released through
  // `memory_probe` if given, the model corrected) and its microbatch split with
  // planner::SplitMicrobatch and retried, up to `max_split_depth` halvings. The stream then yields
  // the halves as separate microbatches. No gradient is involved: the caller's backward runs after
  // the hand-back.
  admission::MemoryModel* memory_model = nullptr;
  int64_t memory_cap_bytes = 0;
  admission::MemoryProbe* memory_probe = nullptr;
  int max_split_depth = 4;
  // The rank's recovery ledger (admission/ledger.h), optional; it must outlive the trainer, and
  // each process writes its own. Every ForwardMicroBatches/DpRankForward call is one ledger step
  // (numbered on from the last step the ledger began): its plan is recorded, every attempt at a
  // microbatch as started (once the model's forward is called), an out-of-memory attempt as
  // failed and then split (halves "m.0" and "m.1"), a microbatch as completed once its outputs
  // are handed back, and the step committed (fsynced, per LedgerOptions) when the call's last
  // microbatch has been handed back.
  // The trainer queues these writes (Ledger::QueueBeginStep, QueueRecord, QueueCommitStep) and
  // never waits for the file: the ledger's writer thread writes them in order, so the file lags
  // the hand-backs by the writes still queued and a crash loses those (never part of one; the
  // file stays an intact prefix, every token completed at most once). SaveState waits until
  // every write is written and durable; a caller that persists its own state (its accumulated
  // gradients, say) calls ledger->AwaitDurable() first, so that the ledger is never behind what
  // it saved. A queued write that fails (I/O; the exactly-once triggers, which the trainer's own
  // plans never trip) is the error of every later call using the ledger, and nothing after it is
  // written. A call that ends early (an error, a crash, a stream not read to its end) leaves its
  // step open: Ledger::Replay then names microbatches of it the caller received, none twice (all
  // of them once AwaitDurable has returned; after a crash, those whose records were written),
  // and the trainer refuses to begin another step (kFailedPrecondition naming the open one) until
  // the caller has decided what to do with the interrupted work and continues on a new ledger
  // file.
  admission::Ledger* ledger = nullptr;
  // Activation checkpointing of the blocks a model runs through ShardWork::RunBlock: their
  // activations are recomputed in backward, with the forward's randomness replayed. Default: off.
  bool activation_checkpointing = false;
  // Negative-control switches, for oracles that must show their checks can fail; leave them on.
  // Off: the model's forward runs on the caller's stream (no model-stream scope).
  bool model_stream_scope = true;
  // Off: the caller's RNG is never synchronized across the group.
  bool synchronize_caller = true;
};

class TrainerRank;

// What SaveState writes besides the weights, the optimizer and the trainer's own counters.
struct SaveOptions {
  static SaveOptions Defaults() { return SaveOptions(); }
  // Every RNG stream of the rank (the caller's default generators, the model stream, named
  // streams), so that a restart continues bit-exactly. Off by default: a restart then draws
  // from whatever state the new process has.
  bool include_rng_streams = false;
};

// Removes a directory TrainerRank::SaveState wrote (its files, then the directory), best effort.
void RemoveSavedState(const std::string& dir);

// What LoadState restored.
struct LoadReport {
  int weights = 0;
  bool optimizer = false;
  bool rng_streams = false;
};

namespace internal {
// One forward call's place in the ledger (TrainerConfig::ledger): its step and the ids of its
// plan's microbatches ("3", then "3.0" and "3.1" after a split, as the ledger names halves).
struct LedgerCall {
  int64_t step = -1;  // -1: no ledger
  std::vector<std::string> ids;
};
}  // namespace internal

// Pull-based microbatch stream of one ForwardMicroBatches call.
class MicrobatchStream {
 public:
  // The next microbatch's full outputs (the caller's RNG synchronized across the group), or
  // nullopt when the plan is done. Collective over the TP x CP group. After an error the stream is
  // finished.
  absl::StatusOr<std::optional<MicrobatchOutput>> Next();

  const planner::Plan& plan() const { return plan_; }

 private:
  friend class TrainerRank;
  MicrobatchStream(TrainerRank* trainer, planner::Plan plan, TrainerInputs inputs)
      : trainer_(trainer), plan_(std::move(plan)), inputs_(std::move(inputs)) {}

  TrainerRank* trainer_;
  planner::Plan plan_;
  TrainerInputs inputs_;
  // Halvings each microbatch of plan_ went through.
  std::vector<int> split_depth_;
  internal::LedgerCall ledger_;
  int next_ = 0;
  bool failed_ = false;
};

class TrainerRank {
 public:
  struct Collaborators {
    static Collaborators Of(collectives::Topology topology, int world_rank,
                            collectives::Communicator* tp_cp_group,
                            std::shared_ptr<rng::RankStreams> streams) {
      Collaborators c{std::move(topology), world_rank, tp_cp_group, std::move(streams)};
      return c;
    }
    collectives::Topology topology;
    int world_rank = 0;
    // The rank's TP x CP group (topology.TpCpGroup(world_rank)); nullptr only for a world of one.
    collectives::Communicator* tp_cp_group = nullptr;
    std::shared_ptr<rng::RankStreams> streams;
  };

  // Checks the collaborators (kInvalidArgument naming what is wrong: a group that is not the
  // rank's TP x CP group, no streams, a bad token budget), then synchronizes the caller's RNG
  // across the group. Collective.
  static absl::StatusOr<std::unique_ptr<TrainerRank>> Create(const TrainerConfig& config,
                                                             Collaborators collaborators,
                                                             ForwardAdapter forward);

  // Plans `inputs` (inside the model-stream scope), checks the plan agrees across the group and
  // returns the stream of its microbatches. kFailedPrecondition while a scope or fork is active.
  absl::StatusOr<MicrobatchStream> ForwardMicroBatches(TrainerInputs inputs);

  // The same work, every microbatch's outputs at once; then the caller's RNG is synchronized.
  absl::StatusOr<std::vector<MicrobatchOutput>> DpRankForward(TrainerInputs inputs);

  // Registers a custom object (e.g. a loss head): checks every replica registers `name` with the
  // same `metadata`, synchronizes the caller's RNG, runs `factory` (which returns the object's
  // parameters) and broadcasts those parameters from the group's leader, in place. Returns them.
  absl::StatusOr<std::vector<at::Tensor>> RegisterCustomObject(
      const std::string& name, const std::string& metadata,
      const std::function<absl::StatusOr<std::vector<at::Tensor>>()>& factory);

  // Synchronizes the caller's RNG across the TP x CP group (what every hand-back ends with).
  absl::Status SynchronizeCaller();

  // Saves this rank's training state into directory `dir`, which must not exist:
  // weights.safetensors (`weights` by name, numerics' format, so `inventory` and `compare` read
  // it), optimizer.pt (torch::save of `optimizer`, if given), rng.bin (opt-in: the sealed RNG
  // resume state, rng/resume_state.h) and trainer.txt (this trainer's forward counter). Written
  // to a sibling temporary directory and renamed into place, so `dir` is complete or absent.
  // kFailedPrecondition inside a model-stream scope or fork, or if `dir` exists.
  absl::Status SaveState(const std::string& dir, const numerics::NamedTensors& weights,
                         const torch::optim::Optimizer* optimizer, const SaveOptions& options);

  // Loads what SaveState wrote: copies each saved weight into the tensor of that name in
  // `weights` (in place, without recording gradients), loads the optimizer (if given and saved),
  // restores the RNG streams if they were saved, and the forward counter. kInvalidArgument naming
  // the tensor for a missing, extra or differently shaped weight; kDataLoss for a damaged file;
  // nothing of the RNG state changes unless all of it is valid.
  absl::StatusOr<LoadReport> LoadState(const std::string& dir, numerics::NamedTensors& weights,
                                       torch::optim::Optimizer* optimizer);

  int cp_rank() const { return cp_rank_; }
  int cp_size() const { return collaborators_.topology.cp_size(); }
  rng::RankStreams& streams() { return *collaborators_.streams; }

 private:
  friend class MicrobatchStream;
  TrainerRank(TrainerConfig config, Collaborators collaborators, ForwardAdapter forward,
              int cp_rank, std::vector<int> cp_holders)
      : config_(config),
        collaborators_(std::move(collaborators)),
        forward_(std::move(forward)),
        cp_rank_(cp_rank),
        cp_holders_(std::move(cp_holders)) {}

  absl::StatusOr<planner::Plan> Plan(const TrainerInputs& inputs);
  // On a GPU, queues the copy of the first microbatch's shard inputs (when they are not one run
  // of rows) right after planning, so that it runs while the plan agreement and the rest of the
  // host work before the forward do; RunMicrobatch takes it if the microbatch's rows are the
  // same. Best effort: on any failure nothing is kept.
  void PrefetchFirstShard(const planner::Plan& plan, const TrainerInputs& inputs);
  // Runs microbatch `m` (inside the model-stream scope) and gathers its full outputs. With
  // admission, an agreed out-of-memory outcome is kResourceExhausted on every replica.
  // `before_gather`, when set, runs once the forward is queued, its outcome agreed and its
  // output checked, before the gather (the stream ends the scope and synchronizes the caller
  // there).
  absl::StatusOr<MicrobatchOutput> RunMicrobatch(
      const planner::Plan& plan, int m, const TrainerInputs& inputs,
      const internal::LedgerCall& call, const std::function<absl::Status()>& before_gather);
  // RunMicrobatch with the recovery loop: on an agreed out-of-memory outcome, rewinds the model
  // stream, splits microbatch `m` of `plan` (and `depth`) and retries its first half.
  absl::StatusOr<MicrobatchOutput> RunWithRecovery(
      planner::Plan& plan, std::vector<int>& depth, internal::LedgerCall& call, int m,
      const TrainerInputs& inputs, const std::function<absl::Status()>& before_gather);
  // The ledger's part of a forward call (no-ops without a ledger): the step begins with the
  // plan; events of microbatch m; the step commits.
  absl::Status BeginLedgerStep(const planner::Plan& plan, internal::LedgerCall& call);
  absl::Status RecordLedger(const internal::LedgerCall& call, admission::LedgerEventKind kind,
                            const planner::Plan& plan, int m, std::string detail = "");
  absl::Status CommitLedgerStep(const internal::LedgerCall& call);
  // Refuses a plan whose microbatches do not fit alone under the cap (with admission).
  absl::Status Admit(const planner::Plan& plan) const;
  std::string Where(absl::string_view operation) const;

  TrainerConfig config_;
  Collaborators collaborators_;
  ForwardAdapter forward_;
  int cp_rank_;
  // By CP rank: the group rank of its first member, whose gathered shard the gather reads.
  std::vector<int> cp_holders_;
  int64_t forward_index_ = 0;
  // The TP x CP group when it has other members; nullptr for a group of one, where every
  // agreement holds without a collective (measured: a plan agreement over a one-member Gloo
  // group cost ~0.45 ms per microbatch of 65,536 tokens on a 2-core VM).
  collectives::Communicator* Replicas() const {
    collectives::Communicator* group = collaborators_.tp_cp_group;
    return group != nullptr && group->size() > 1 ? group : nullptr;
  }
  // The ledger step the next forward call records (TrainerConfig::ledger).
  int64_t next_ledger_step_ = 0;
  // The recompute's stream saver (activation checkpointing); null when off.
  std::shared_ptr<const checkpoint::RngStateSaver> recompute_streams_;
  int64_t out_of_memory_ = 0;
  // A packed token range of a microbatch and where its output rows come from: this rank's own
  // forward output, or the gathered shard of group member `member`, from row `row`.
  struct PieceSource {
    static constexpr int kOwn = -1;
    int64_t begin = 0;
    int64_t count = 0;
    int member = kOwn;
    int64_t row = 0;
  };
  // The first microbatch's shard inputs, selected ahead (PrefetchFirstShard): the rows tensor
  // and the runs of its rows they were selected from.
  struct PrefetchedInputs {
    at::Tensor rows;
    int64_t version = 0;                // the rows' version counter then
    std::optional<c10::Stream> stream;  // the stream the copy was queued on
    std::vector<std::pair<int64_t, int64_t>> runs;
    at::Tensor inputs;
  };
  std::optional<PrefetchedInputs> prefetched_;
  // Per-token lists of RunMicrobatch, kept between microbatches so their memory is reused.
  struct Scratch {
    std::vector<int64_t> row_offset, my_rows;
    std::vector<std::pair<int64_t, int64_t>> row_runs;  // (first caller row, count)
    std::vector<int64_t> gather_index;
    std::vector<PieceSource> piece_sources;
  } scratch_;

 public:
  // Out-of-memory outcomes recovered so far (with admission).
  int64_t out_of_memory_recovered() const { return out_of_memory_; }
};

}  // namespace trainer
}  // namespace lockstep

#endif  // LOCKSTEP_TRAINER_TRAINER_RANK_H_
