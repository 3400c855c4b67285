#include "trainer/internal/trainer_core.h"

#include <algorithm>
#include <numeric>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "checkpoint/checkpoint.h"
#include "collectives/agreement.h"
#include "rng/snapshot.h"
#include "rng/synchronize.h"

namespace lockstep {
namespace trainer {
namespace internal {
namespace {

// The bytes a model stream's state is compared on across the replicas.
std::string StateBytes(const rng::RngSnapshot& state) {
  std::string bytes = state.cpu_state();
  if (state.cuda().has_value())
    absl::StrAppend(&bytes, "/", state.cuda()->seed, "/", state.cuda()->offset);
  return bytes;
}

}  // namespace

struct TrainerCore::Attempt {
  ShardWork work;
  // By CP rank: its pieces of the microbatch, and their token counts.
  std::vector<std::vector<planner::ShardPiece>> pieces;
  int64_t my_tokens = 0;
  // The model stream where the attempt began (rewound to on a failure anywhere in the group).
  std::optional<rng::RngSnapshot> before;
  bool counted = false;  // the attempt took a forward index
  at::Tensor local;      // this rank's forward output
  MicrobatchOutput out;
};

absl::StatusOr<std::shared_ptr<TrainerCore>> TrainerCore::Create(TrainerConfig config,
                                                                 Collaborators collaborators,
                                                                 ForwardAdapter forward,
                                                                 const ContractSeams& seams) {
  const collectives::Topology& topology = collaborators.topology;
  if (collaborators.streams == nullptr) {
    return absl::InvalidArgumentError("trainer: no RankStreams given");
  }
  if (!forward) return absl::InvalidArgumentError("trainer: no forward adapter given");
  if (config.plan.max_tokens_per_microbatch < 2 * topology.cp_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer: max_tokens_per_microbatch ", config.plan.max_tokens_per_microbatch,
                     " is below 2 x CP size (", 2 * topology.cp_size(), ")"));
  }
  if (config.memory_model.has_value() && config.memory_cap_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("trainer: memory_cap_bytes ",
                                                   config.memory_cap_bytes,
                                                   " must be positive with a memory model"));
  }
  if (config.recovery.max_split_depth < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer: max_split_depth ", config.recovery.max_split_depth, " is negative"));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::Coordinates mine,
                            topology.CoordinatesOf(collaborators.world_rank));
  const std::vector<int> expected = topology.TpCpGroup(collaborators.world_rank);
  std::vector<int> members = {collaborators.world_rank};
  if (collaborators.tp_cp_group != nullptr) members = collaborators.tp_cp_group->global_ranks();
  if (members != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer: rank ", collaborators.world_rank, "'s group holds global ranks [",
        absl::StrJoin(members, ", "), "], not its TP x CP group [", absl::StrJoin(expected, ", "),
        "]", collaborators.tp_cp_group == nullptr ? " (no group given)" : ""));
  }
  // The first group member of each CP rank: its gathered shard is the one read.
  std::vector<int> cp_holders(topology.cp_size(), -1);
  for (size_t g = 0; g < members.size(); ++g) {
    LOCKSTEP_ASSIGN_OR_RETURN(collectives::Coordinates c, topology.CoordinatesOf(members[g]));
    if (cp_holders[c.cp] < 0) cp_holders[c.cp] = static_cast<int>(g);
  }
  if (!seams.route_gathered_rows && cp_holders.size() > 1) {
    // The control: CP rank c's rows read from CP rank c + 1's shard.
    std::rotate(cp_holders.begin(), cp_holders.begin() + 1, cp_holders.end());
  }
  std::shared_ptr<TrainerCore> core(new TrainerCore(std::move(config), std::move(collaborators),
                                                    std::move(forward), seams, mine.cp,
                                                    std::move(cp_holders)));
  if (core->collaborators_.ledger != nullptr) {
    // Step numbers go on from the last step this rank's ledger began (committed or not: an
    // interrupted call keeps its record).
    core->next_ledger_step_ = core->collaborators_.ledger->last_begun_step() + 1;
  }
  if (core->config_.activation_checkpointing) {
    core->recompute_streams_ = checkpoint::StreamSnapshots::Of(core->collaborators_.streams);
  }
  LOCKSTEP_RETURN_IF_ERROR(core->HandBack(HandBackPoint::kCreate, "creating the trainer"));
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(core->AgreeOnModelStream(),
                                        core->Where("creating the trainer"));
  return core;
}

absl::Status TrainerCore::AgreeOnModelStream() {
  rng::ModelStream& model = streams().model();
  if (!model.state().has_value()) {
    // Derived now, from the caller state Create just synchronized, instead of at the first scope
    // from whatever the caller drew on each replica in between.
    LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot caller,
                              rng::RngSnapshot::Capture(streams().generators()));
    LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot derived, rng::ModelStream::Derive(caller));
    return model.Restore(std::move(derived));
  }
  if (Replicas() == nullptr) return absl::OkStatus();
  // Set before Create (an earlier trainer, a restored resume state): it must agree already.
  return Annotate(
      collectives::CheckAgreement(*Replicas(), "trainer/model_stream", StateBytes(*model.state())),
      "the model stream was set before Create (by an earlier scope or a restored "
      "resume state) and differs across the TP x CP group");
}

std::string TrainerCore::Where(absl::string_view operation) const {
  return absl::StrCat("trainer rank ", collaborators_.world_rank, ": ", operation);
}

absl::Status TrainerCore::HandBack(HandBackPoint point, absl::string_view where) {
  const bool kept = point == HandBackPoint::kCreate       ? seams_.synchronize_at_create
                    : point == HandBackPoint::kMicrobatch ? seams_.synchronize_after_each_microbatch
                    : point == HandBackPoint::kAllMicrobatches
                        ? seams_.synchronize_after_all_microbatches
                    : point == HandBackPoint::kCustomObject ? seams_.synchronize_at_registration
                                                            : true;
  if (!kept) return absl::OkStatus();
  return Annotate(rng::Synchronize(collaborators_.tp_cp_group.get(), streams()),
                  Where(absl::StrCat("synchronizing the caller's RNG ", where)));
}

absl::StatusOr<std::optional<rng::ModelStreamScope>> TrainerCore::EnterModelStream() {
  if (!seams_.model_stream_scope) return std::optional<rng::ModelStreamScope>();
  LOCKSTEP_ASSIGN_OR_RETURN(rng::ModelStreamScope scope, rng::ModelStreamScope::Enter(streams()));
  return std::optional<rng::ModelStreamScope>(std::move(scope));
}

absl::StatusOr<admission::RecoveryLoop> TrainerCore::BeginStep(const TrainerInputs& inputs,
                                                               bool held_until_the_end) {
  int64_t tokens = 0;
  for (const planner::Sequence& s : inputs.sequences) tokens += s.num_tokens;
  if (!inputs.rows.defined() || inputs.rows.dim() < 1 || inputs.rows.size(0) != tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where("planning"), ": the input rows (",
        inputs.rows.defined() ? absl::StrCat(inputs.rows.dim() >= 1 ? inputs.rows.size(0) : 0)
                              : "undefined",
        ") must have one row per token of the sequences (", tokens, ")"));
  }
  planner::PlanOptions options = config_.plan;
  options.cp_size = cp_size();
  LOCKSTEP_ASSIGN_OR_RETURN(planner::Plan plan,
                            planner::PlanMicrobatches(inputs.sequences, options));
  // On a GPU the first shard's copy runs while the group agrees on the plan.
  prefetched_.Prefetch(plan, inputs.sequences, inputs.rows, cp_rank_);

  admission::RecoveryCollaborators collaborators = admission::RecoveryCollaborators::Of(Replicas());
  if (config_.memory_model.has_value()) {
    collaborators.model = &*config_.memory_model;
    collaborators.cap_bytes = config_.memory_cap_bytes;
    collaborators.probe = collaborators_.memory_probe.get();
  }
  collaborators.ledger = collaborators_.ledger;
  collaborators.writes = admission::LedgerStep::Writes::kQueued;
  admission::RecoveryOptions recovery = config_.recovery;
  recovery.admission.max_microbatches_per_wave = 1;
  recovery.admission.held_until_the_end = held_until_the_end;
  const int64_t step = next_ledger_step_;
  absl::StatusOr<admission::RecoveryLoop> loop =
      admission::RecoveryLoop::Begin(collaborators, recovery, step, std::move(plan));
  if (!loop.ok()) return Annotate(loop.status(), Where(absl::StrCat("beginning step ", step)));
  ++next_ledger_step_;
  return loop;
}

absl::Status TrainerCore::RunAttempt(const admission::WaveWork& wave, const TrainerInputs& inputs,
                                     Attempt& attempt) {
  const planner::Plan& plan = *wave.plan;
  const int m = wave.microbatches.at(0);  // one microbatch per wave (BeginStep)
  const std::string where = absl::StrCat("microbatch ", m);
  const planner::Microbatch& mb = plan.microbatches(m);
  // Only what the model's forward reads is built before it is called; what is handed back per
  // token is built after, while the forward's kernels run.
  RowOffsets(inputs.sequences, row_offset_);
  attempt.pieces.assign(cp_size(), {});
  int64_t widest = 0;
  for (int c = 0; c < cp_size(); ++c) {
    LOCKSTEP_ASSIGN_OR_RETURN(attempt.pieces[c], planner::ShardPieces(plan, m, c));
    int64_t count = 0;
    for (const planner::ShardPiece& p : attempt.pieces[c]) count += p.end - p.begin;
    widest = std::max(widest, count);
    if (c == cp_rank_) attempt.my_tokens = count;
  }
  ShardWork& work = attempt.work;
  work.plan = &plan;
  work.microbatch = m;
  work.cp_rank = cp_rank_;
  work.cp_size = cp_size();
  work.forward_index = forward_index_++;
  attempt.counted = true;
  work.recompute_streams_ = recompute_streams_;
  work.widest_shard = widest;
  work.pieces_ = attempt.pieces[cp_rank_];
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
      CallTorch("selecting the shard's inputs",
                [&] {
                  ShardRowRuns(mb, work.pieces_, row_offset_, row_runs_);
                  std::optional<at::Tensor> ahead = prefetched_.Take(inputs.rows, row_runs_);
                  work.inputs = ahead.has_value()
                                    ? *std::move(ahead)
                                    : SelectRows(inputs.rows, row_runs_, scratch_rows_);
                }),
      where);
  absl::StatusOr<at::Tensor> forwarded = absl::UnknownError("the forward was not called");
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
      CallTorch("the model's forward", [&] { forwarded = forward_(work); }), where);
  if (!forwarded.ok()) {
    return Annotate(forwarded.status(), absl::StrCat(where, ": the model's forward"));
  }
  attempt.local = *std::move(forwarded);
  const at::Tensor& local = attempt.local;
  if (!local.defined() || local.dim() < 1 || local.size(0) != attempt.my_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the forward adapter returned ",
                     local.defined() ? absl::StrCat(local.dim() >= 1 ? local.size(0) : -1) : "no",
                     " rows for ", attempt.my_tokens, " tokens"));
  }
  MicrobatchOutput& out = attempt.out;
  out.microbatch = m;
  LOCKSTEP_RETURN_IF_ERROR(
      Annotate(CallTorch("listing the microbatch's rows",
                         [&] {
                           out.input_rows = at::empty({mb.num_tokens()}, at::kLong);
                           int64_t* rows = out.input_rows.data_ptr<int64_t>();
                           for (int k = 0; k < mb.batch_index_size(); ++k) {
                             std::iota(rows + mb.cu_seqlens(k), rows + mb.cu_seqlens(k + 1),
                                       CallerRow(mb, row_offset_, k, mb.cu_seqlens(k)));
                           }
                           out.loss_weights = at::empty({mb.num_tokens()}, at::kDouble);
                         }),
               where));
  // Written straight into the tensor's storage (a double per token).
  return Annotate(
      planner::WriteTokenLossWeights(mb, inputs.sequences,
                                     absl::MakeSpan(out.loss_weights.data_ptr<double>(),
                                                    static_cast<size_t>(out.loss_weights.numel()))),
      where);
}

absl::StatusOr<RanMicrobatch> TrainerCore::RunNext(
    admission::RecoveryLoop& loop, const TrainerInputs& inputs,
    const std::function<absl::Status()>& before_gather, bool scope_fresh) {
  std::optional<Attempt> attempt;
  // Where this call's attempts begin: a failed attempt rewinds the model stream to it, so every
  // attempt of the call begins there. In a fresh scope it is the state the scope installed.
  std::optional<rng::RngSnapshot> start;
  if (scope_fresh && seams_.model_stream_scope) start = streams().model().state();
  admission::AttemptHooks hooks;
  hooks.attempt = [&](const admission::WaveWork& wave) -> absl::Status {
    attempt.emplace();
    if (!start.has_value()) {
      LOCKSTEP_ASSIGN_OR_RETURN(start, rng::RngSnapshot::Capture(streams().generators()));
    }
    attempt->before = *start;
    return RunAttempt(wave, inputs, *attempt);
  };
  hooks.on_failure = [&](const admission::WaveWork&) {
    // Note [Outcome agreement]: every replica drops the attempt alike — the model stream back to
    // where the attempt began (the replica that failed may have drawn part of it), the attempt's
    // forward index returned.
    if (attempt->before.has_value()) {
      const absl::Status rewound = attempt->before->Restore();
      if (!rewound.ok()) LOCKSTEP_LOG(ERROR) << Where("rewinding the model stream: ") << rewound;
    }
    if (attempt->counted) --forward_index_;
  };
  hooks.on_success = [&](const admission::WaveWork& wave) -> absl::Status {
    if (before_gather) LOCKSTEP_RETURN_IF_ERROR(before_gather());
    if (Replicas() == nullptr || cp_size() == 1) {
      attempt->out.outputs = attempt->local;
      return absl::OkStatus();
    }
    if (!seams_.gather_with_an_empty_shard &&
        std::any_of(attempt->pieces.begin(), attempt->pieces.end(),
                    [](const std::vector<planner::ShardPiece>& p) { return p.empty(); })) {
      // The control: no gather; the other CP ranks' rows stay zero.
      const int64_t tokens = wave.plan->microbatches(attempt->work.microbatch).num_tokens();
      return CallTorch("handing back only this rank's rows", [&] {
        const at::Tensor& offsets = attempt->work.packed_offsets();
        std::vector<int64_t> shape = attempt->local.sizes().vec();
        shape[0] = tokens;
        attempt->out.outputs = at::zeros(shape, attempt->local.options())
                                   .index_copy(0, offsets.to(attempt->local.device()),
                                               attempt->local.narrow(0, 0, offsets.numel()));
      });
    }
    ShardLayout layout;
    layout.microbatch = &wave.plan->microbatches(attempt->work.microbatch);
    layout.pieces = std::move(attempt->pieces);
    layout.cp_rank = cp_rank_;
    layout.cp_holders = &cp_holders_;
    layout.widest = attempt->work.widest_shard;
    LOCKSTEP_ASSIGN_OR_RETURN(
        attempt->out.outputs,
        assembly_.Gather(*collaborators_.tp_cp_group, layout, attempt->local,
                         absl::StrCat("microbatch ", attempt->work.microbatch)));
    return absl::OkStatus();
  };
  const int out_of_memory_before = loop.report().out_of_memory;
  absl::StatusOr<admission::WaveWork> wave = loop.RunNext(hooks);
  out_of_memory_ += loop.report().out_of_memory - out_of_memory_before;
  if (!wave.ok()) return Annotate(wave.status(), Where(absl::StrCat("step ", loop.step())));
  return RanMicrobatch{std::move(attempt->out), *std::move(wave)};
}

absl::StatusOr<numerics::NamedTensors> TrainerCore::RegisterCustomObject(
    const std::string& name, const std::string& metadata, const CustomObjectFactory& factory) {
  return custom_objects_.Register(
      collaborators_.tp_cp_group.get(), streams(),
      [&] { return HandBack(HandBackPoint::kCustomObject, "before its factory"); },
      Where(absl::StrCat("registering custom object '", name, "'")), name, metadata, factory);
}

}  // namespace internal
}  // namespace trainer
}  // namespace lockstep
