// trainer/internal/trainer_core.h  (private to trainer/)
//
// TrainerCore: the state and work behind TrainerRank (trainer_rank.h), which is its public face.
// A MicrobatchStream reaches it only through a weak reference and the few methods below
// (EnterModelStream, BeginStep, RunNext, HandBack), so a stream never changes the trainer's
// state behind its back and a stream that outlives its trainer is refused, not undefined.
//
// Note [Hand-back rule]: the caller's RNG is synchronized across the TP x CP group (its leader's
// state wins) at every point where control returns to the caller with outputs — each
// microbatch a stream yields, each ForwardAllMicrobatches return — and at Create. Between two
// hand-backs the caller may draw anything on any replica (a leader-only sample, a rank-dependent
// mask); the next hand-back makes the replicas agree again. The model-stream scope never spans a
// hand-back. A stream synchronizes as soon as its scope has ended, once the forward is queued and
// its outcome agreed, before the gather: the gather and the assembly draw no random numbers.
//
// Thread-safety: as TrainerRank (one thread).

#ifndef LOCKSTEP_TRAINER_INTERNAL_TRAINER_CORE_H_
#define LOCKSTEP_TRAINER_INTERNAL_TRAINER_CORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "admission/recovery_loop.h"
#include "checkpoint/rng_state_saver.h"
#include "collectives/communicator.h"
#include "collectives/topology.h"
#include "numerics/named_tensors.h"
#include "rng/model_stream.h"
#include "rng/rank_streams.h"
#include "trainer/internal/custom_objects.h"
#include "trainer/internal/output_assembly.h"
#include "trainer/internal/shard_inputs.h"
#include "trainer/shard_work.h"
#include "trainer/trainer_config.h"

namespace lockstep {
namespace trainer {
namespace internal {

// What a negative control may break, to show that a check catches it (tools/qualify's
// --negative_control, the oracle's controls). Everything is kept by default; production code
// never changes these.
struct ContractSeams {
  static ContractSeams Kept() { return ContractSeams(); }
  // Off: planning and the model's forward run on the caller's stream (no model-stream scope).
  bool model_stream_scope = true;
  // Off: the caller's RNG is not synchronized at Create / before a custom object's factory /
  // after a stream's hand-back / after ForwardAllMicrobatches (Note [Hand-back rule]).
  bool synchronize_at_create = true;
  bool synchronize_at_registration = true;
  bool synchronize_after_each_microbatch = true;
  bool synchronize_after_all_microbatches = true;
  // Off: the output gather reads each other CP rank's rows from the next CP rank's gathered
  // shard (a misrouted gather; no effect at CP 1, where nothing is gathered).
  bool route_gathered_rows = true;
  // Off: a microbatch that leaves a CP rank without tokens skips the output gather, and each
  // member hands back its own rows with the others' left zero (every member decides alike, from
  // the agreed plan, so none waits for the rest).
  bool gather_with_an_empty_shard = true;
};

// Where a hand-back synchronizes the caller (Note [Hand-back rule]).
enum class HandBackPoint { kCreate, kMicrobatch, kAllMicrobatches, kCustomObject, kExplicit };

// One microbatch's attempt and its result, as RunNext hands it back.
struct RanMicrobatch {
  MicrobatchOutput output;
  admission::WaveWork wave;
};

class TrainerCore {
 public:
  // Checks the collaborators (kInvalidArgument naming what is wrong), synchronizes the caller's
  // RNG across the group and sets the model stream so that it agrees across the group whatever
  // the caller draws after Create (derived from the synchronized caller state; one set before
  // Create must already agree: kFailedPrecondition naming the ranks otherwise). Collective.
  static absl::StatusOr<std::shared_ptr<TrainerCore>> Create(TrainerConfig config,
                                                             Collaborators collaborators,
                                                             ForwardAdapter forward,
                                                             const ContractSeams& seams);

  // The model-stream scope (none when the negative control turns it off).
  absl::StatusOr<std::optional<rng::ModelStreamScope>> EnterModelStream();

  // Plans `inputs` (Note [Planning draws nothing] in trainer_rank.cc), then begins the step's
  // recovery loop (the group's agreement on the plan and its admission, the ledger step).
  // `held_until_the_end`: every microbatch's outputs are handed back at once (admission adds what
  // they keep held).
  absl::StatusOr<admission::RecoveryLoop> BeginStep(const TrainerInputs& inputs,
                                                    bool held_until_the_end);

  // Inside the model-stream scope: runs the loop's next microbatch on this rank's shard, agrees
  // on its outcome across the group (Note [Outcome agreement] in collectives/outcome.h), then
  // runs `before_gather` (if set) and gathers the full outputs. A failure on any replica fails
  // every replica promptly, with the model stream rewound to where the attempt began; out of
  // memory with admission is recovered by the loop. `scope_fresh`: the scope was entered for this
  // call and nothing drew since, so the live model stream is the one the scope stored (no capture
  // of the generators is needed to know where the attempt began). Precondition: !loop.done().
  absl::StatusOr<RanMicrobatch> RunNext(admission::RecoveryLoop& loop, const TrainerInputs& inputs,
                                        const std::function<absl::Status()>& before_gather,
                                        bool scope_fresh);

  // Synchronizes the caller's RNG across the group, unless the negative control for `point`
  // turns it off (Note [Hand-back rule]).
  absl::Status HandBack(HandBackPoint point, absl::string_view where);

  // RegisterCustomObject (custom_objects.h) over this trainer's group and streams.
  absl::StatusOr<numerics::NamedTensors> RegisterCustomObject(const std::string& name,
                                                              const std::string& metadata,
                                                              const CustomObjectFactory& factory);

  // "trainer rank <r>: <operation>": where an error happened.
  std::string Where(absl::string_view operation) const;

  const TrainerConfig& config() const { return config_; }
  admission::Ledger* ledger() const { return collaborators_.ledger.get(); }
  const admission::MemoryModel* memory_model() const {
    return config_.memory_model.has_value() ? &*config_.memory_model : nullptr;
  }
  rng::RankStreams& streams() const { return *collaborators_.streams; }
  int cp_rank() const { return cp_rank_; }
  int cp_size() const { return collaborators_.topology.cp_size(); }
  int64_t forward_index() const { return forward_index_; }
  void set_forward_index(int64_t index) { forward_index_ = index; }
  int64_t out_of_memory_recovered() const { return out_of_memory_; }

 private:
  TrainerCore(TrainerConfig config, Collaborators collaborators, ForwardAdapter forward,
              const ContractSeams& seams, int cp_rank, std::vector<int> cp_holders)
      : config_(std::move(config)),
        collaborators_(std::move(collaborators)),
        forward_(std::move(forward)),
        seams_(seams),
        cp_rank_(cp_rank),
        cp_holders_(std::move(cp_holders)) {}

  // Sets or checks the model stream at Create (see Create).
  absl::Status AgreeOnModelStream();
  // The microbatch's attempt on this rank: select the shard's inputs, run the forward, check its
  // output, build what is handed back per token. Its error is this rank's outcome.
  struct Attempt;
  absl::Status RunAttempt(const admission::WaveWork& wave, const TrainerInputs& inputs,
                          Attempt& attempt);

  // The TP x CP group when it has other members; nullptr for a group of one, where every
  // agreement holds without a collective (Note [A group of one is no group]).
  collectives::Communicator* Replicas() const {
    return collectives::WithOthers(collaborators_.tp_cp_group.get());
  }

  TrainerConfig config_;
  Collaborators collaborators_;
  ForwardAdapter forward_;
  ContractSeams seams_;
  int cp_rank_;
  std::vector<int> cp_holders_;
  int64_t forward_index_ = 0;
  // The ledger step the next forward call records (TrainerConfig::ledger).
  int64_t next_ledger_step_ = 0;
  int64_t out_of_memory_ = 0;
  // The recompute's stream saver (activation checkpointing); null when off.
  std::shared_ptr<const checkpoint::RngStateSaver> recompute_streams_;
  PrefetchedShard prefetched_;
  OutputAssembly assembly_;
  CustomObjectRegistry custom_objects_;
  // Per-microbatch lists, kept so their memory is reused.
  std::vector<int64_t> row_offset_, scratch_rows_;
  RowRuns row_runs_;
};

// A MicrobatchStream's step (trainer_rank.h): the trainer it came from, its recovery loop (the
// plan as split, the ids, the ledger step) and its inputs.
struct StreamState {
  std::weak_ptr<TrainerCore> core;
  admission::RecoveryLoop loop;
  TrainerInputs inputs;
  bool failed = false;
};

}  // namespace internal
}  // namespace trainer
}  // namespace lockstep

#endif  // LOCKSTEP_TRAINER_INTERNAL_TRAINER_CORE_H_
