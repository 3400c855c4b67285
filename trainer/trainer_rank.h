// trainer/trainer_rank.h
//
// TrainerRank: the rank-local trainer core. It composes planner (plans and their agreement),
// rng (the rank's streams, model-stream scopes, synchronization), collectives (the TP x CP group)
// and admission (waves under a memory cap, out-of-memory recovery, the ledger) behind one object
// that a LibTorch program adopts by one Bazel label (//trainer:trainer_rank). The caller owns the
// model's loss, backward, optimizer step, DP partitioning and accumulation boundaries;
// TrainerRank runs the model's forward on this rank's CP shard of each planned microbatch and
// hands every TP/CP replica the full outputs.
//
// RNG contract (SPEC "trainer"):
// - The caller's inputs are materialised under the caller's RNG before they are given here; no
//   library work happens before.
// - Planning and the model's forward run inside the model-stream scope (rng/model_stream.h);
//   the scope never spans a hand-back to the caller.
// - Note [Hand-back rule] (internal/trainer_core.h): after each hand-back — each microbatch a
//   MicrobatchStream yields, each ForwardAllMicrobatches return — and at Create, the caller's RNG
//   state is synchronized across the TP x CP group (its leader's state wins), so the caller's
//   draws (token masks, a custom head's dropout) agree on every replica, whatever each replica
//   drew since the last hand-back.
// - The model stream agrees across the replicas: Create derives it from the synchronized caller
//   state, so a draw the caller makes after Create on some replicas only (a leader-only log or
//   sample) changes nothing of it (ART derives it at the first forward from each replica's
//   unsynchronized state).
// - RegisterCustomObject checks the replicas agree on the registration, synchronizes, runs the
//   caller's factory, compares what the factories built and broadcasts the leader's values
//   (internal/custom_objects.h).
//
// Failures (Note [Outcome agreement] in collectives/outcome.h): after every forward the TP x CP
// group exchanges its outcome before anyone waits in the gather. A forward that fails on one
// replica — an exception, an error status, out of memory without admission, a wrong output —
// fails the call on every replica promptly (not after the collective timeout): the failing
// replica with its own error, the others with kAborted naming its global rank and its error. On
// every replica the model stream is then where it stood before the failed microbatch's attempt,
// the caller's state is as the library found it, and the trainer and its communicator stay usable:
// the next call runs normally. With admission, out of memory on any replica is recovered on all
// (TrainerConfig::memory_model). A dead peer is the communicator's error within its timeout.
//
// Collectives: every replica runs the same collectives in the same order; a rank whose CP shard
// of a microbatch is empty still joins the gather (it contributes padding).
//
// Outputs: MicrobatchOutput.outputs holds the microbatch's tokens in packed order; rows gathered
// from other CP ranks are constants, the rank's own rows are differentiable into the model, so
// a loss computed identically on every replica back-propagates each replica's share exactly
// once (sum parameter gradients over the CP group, as for any CP-sharded model).
//
// Lifetimes: the trainer holds a share of its group, streams, memory probe and ledger. A
// MicrobatchStream refers to its trainer weakly: used after the trainer is destroyed, Next()
// fails with kFailedPrecondition.
//
// Thread-safety: one thread uses a TrainerRank (and its streams) at a time.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(auto trainer, trainer::TrainerRank::Create(
//       trainer::TrainerConfig::Of(/*max_tokens_per_microbatch=*/8192),
//       trainer::TrainerRank::Collaborators::Of(topology, world_rank, tp_cp_group, streams),
//       [&](const trainer::ShardWork& work) { return model.Forward(work); }));
//   LOCKSTEP_ASSIGN_OR_RETURN(auto stream, trainer->ForwardMicrobatches(inputs));
//   while (true) {
//     LOCKSTEP_ASSIGN_OR_RETURN(std::optional<trainer::MicrobatchOutput> out, stream.Next());
//     if (!out) break;
//     Loss(*out).backward();   // caller's RNG: agrees on every replica
//   }

#ifndef LOCKSTEP_TRAINER_TRAINER_RANK_H_
#define LOCKSTEP_TRAINER_TRAINER_RANK_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "collectives/topology.h"
#include "numerics/named_tensors.h"
#include "planner/plan.pb.h"
#include "rng/rank_streams.h"
#include "trainer/saved_state.h"
#include "trainer/shard_work.h"
#include "trainer/trainer_config.h"

namespace lockstep {
namespace trainer {

namespace internal {
class TrainerCore;
struct StreamState;
}  // namespace internal

// Pull-based microbatch stream of one ForwardMicrobatches call. Move-only: it owns its step (the
// plan as split by out-of-memory recovery, the microbatches' ledger ids).
class MicrobatchStream {
 public:
  // Takes over the other stream's step; the moved-from stream must not be used again.
  MicrobatchStream(MicrobatchStream&&) noexcept;
  // Drops this stream's step for the other's; the moved-from stream must not be used again.
  MicrobatchStream& operator=(MicrobatchStream&&) noexcept;
  MicrobatchStream(const MicrobatchStream&) = delete;
  MicrobatchStream& operator=(const MicrobatchStream&) = delete;
  ~MicrobatchStream();

  // The next microbatch's full outputs (the caller's RNG synchronized across the group), or
  // nullopt when the plan is done. Collective over the TP x CP group. After an error the stream is
  // finished (later calls return nullopt); kFailedPrecondition inside a model-stream scope or
  // fork, and once the trainer that made the stream is destroyed. A stream dropped before its end
  // leaves no scope open and the caller's state untouched; the trainer's next call works (with a
  // ledger its step stays open: TrainerConfig::ledger).
  absl::StatusOr<std::optional<MicrobatchOutput>> Next();

  // The plan, as split so far.
  const planner::Plan& plan() const;

 private:
  friend class TrainerRank;
  explicit MicrobatchStream(std::unique_ptr<internal::StreamState> state);

  std::unique_ptr<internal::StreamState> state_;
};

// The rank-local trainer core: plans, runs the model's forward on this rank's CP shard, and hands
// the full outputs to every TP x CP replica under lockstep's RNG contract (see the top of this
// file).
class TrainerRank {
 public:
  // What the trainer uses but does not own (trainer_config.h).
  using Collaborators = trainer::Collaborators;

  // Checks the collaborators (kInvalidArgument naming what is wrong: a group that is not the
  // rank's TP x CP group, no streams, a bad token budget or memory cap), synchronizes the
  // caller's RNG across the group and sets the model stream from it (a model stream set before,
  // by an earlier trainer or a restored resume state, must agree across the group:
  // kFailedPrecondition otherwise). Collective.
  static absl::StatusOr<std::unique_ptr<TrainerRank>> Create(TrainerConfig config,
                                                             Collaborators collaborators,
                                                             ForwardAdapter forward);

  // Constructed by Create (and by internal::CreateWithSeams for negative controls).
  explicit TrainerRank(std::shared_ptr<internal::TrainerCore> core);
  ~TrainerRank();
  TrainerRank(const TrainerRank&) = delete;
  TrainerRank& operator=(const TrainerRank&) = delete;

  // Plans `inputs` (drawing no random numbers: Note [Planning draws nothing] in trainer_rank.cc;
  // the microbatches' work runs inside the model-stream scope), checks the plan and its admission
  // agree across the group and returns the stream of its microbatches. kFailedPrecondition while a
  // scope or fork is active; with admission, kResourceExhausted naming a microbatch that cannot
  // fit alone under the cap.
  absl::StatusOr<MicrobatchStream> ForwardMicrobatches(TrainerInputs inputs);

  // The same work, every microbatch's outputs handed back at once; then the caller's RNG is
  // synchronized. With admission, each microbatch must fit under the cap together with what the
  // microbatches before it keep held until this returns (MemoryModel::PredictRetained): a call
  // whose microbatches fit one by one but not together is refused (kResourceExhausted naming the
  // microbatch and both amounts) before anything runs.
  absl::StatusOr<std::vector<MicrobatchOutput>> ForwardAllMicrobatches(TrainerInputs inputs);

  // Registers a custom object (e.g. a loss head) transactionally across the group
  // (internal/custom_objects.h): the same name and `metadata` on every replica, the caller's RNG
  // synchronized, `factory` run on every replica and what it returns compared (names, shapes,
  // dtypes, requires_grad, device types), the leader's values broadcast in place. Returns the
  // tensors. A failing factory or a mismatch registers nothing on any replica (the factory's RNG
  // draws undone) and is an error on every replica naming the rank and the field. A name
  // registered before returns the first object (same metadata) or kAlreadyExists.
  absl::StatusOr<numerics::NamedTensors> RegisterCustomObject(const std::string& name,
                                                              const std::string& metadata,
                                                              const CustomObjectFactory& factory);

  // Synchronizes the caller's RNG across the TP x CP group (what every hand-back ends with).
  absl::Status SynchronizeCaller();

  // Saves this rank's training state into directory `dir`, which must not exist
  // (saved_state.h: weights, optimizer if given, the RNG streams with
  // options.include_rng_streams, the forward counter; complete or absent across power loss), once
  // every ledger write is durable. kFailedPrecondition inside a model-stream scope or fork, or if
  // `dir` exists.
  absl::Status SaveState(const std::string& dir, const numerics::NamedTensors& weights,
                         const torch::optim::Optimizer* optimizer, const SaveOptions& options);

  // Loads what SaveState wrote (saved_state.h): all or nothing — a refused load leaves the
  // weights, the optimizer, every RNG stream and the forward counter as they were.
  absl::StatusOr<LoadReport> LoadState(const std::string& dir, numerics::NamedTensors& weights,
                                       torch::optim::Optimizer* optimizer);

  // This rank's CP coordinate, in [0, cp_size()).
  int cp_rank() const;
  // The topology's CP size.
  int cp_size() const;
  // The rank's streams (Collaborators::streams), shared with the caller.
  rng::RankStreams& streams();
  // Out-of-memory outcomes recovered so far (with admission).
  int64_t out_of_memory_recovered() const;
  // The trainer's memory model as corrected so far (nullptr without admission).
  const admission::MemoryModel* memory_model() const;

 private:
  std::shared_ptr<internal::TrainerCore> core_;
};

}  // namespace trainer
}  // namespace lockstep

#endif  // LOCKSTEP_TRAINER_TRAINER_RANK_H_
