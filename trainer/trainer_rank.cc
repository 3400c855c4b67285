#include "trainer/trainer_rank.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "trainer/internal/trainer_core.h"

namespace lockstep {
namespace trainer {
namespace {

constexpr char kInsideAScope[] = " inside a model-stream scope or named-stream fork";

absl::Status CallerStateLive(const internal::TrainerCore& core, absl::string_view operation) {
  if (core.streams().caller_state_live()) return absl::OkStatus();
  return absl::FailedPreconditionError(core.Where(absl::StrCat(operation, kInsideAScope)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainerRank>> TrainerRank::Create(TrainerConfig config,
                                                                 Collaborators collaborators,
                                                                 ForwardAdapter forward) {
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::shared_ptr<internal::TrainerCore> core,
      internal::TrainerCore::Create(std::move(config), std::move(collaborators), std::move(forward),
                                    internal::ContractSeams::Kept()));
  return std::make_unique<TrainerRank>(std::move(core));
}

TrainerRank::TrainerRank(std::shared_ptr<internal::TrainerCore> core) : core_(std::move(core)) {}
TrainerRank::~TrainerRank() = default;

MicrobatchStream::MicrobatchStream(std::unique_ptr<internal::StreamState> state)
    : state_(std::move(state)) {}
MicrobatchStream::MicrobatchStream(MicrobatchStream&&) noexcept = default;
MicrobatchStream& MicrobatchStream::operator=(MicrobatchStream&&) noexcept = default;
MicrobatchStream::~MicrobatchStream() = default;

const planner::Plan& MicrobatchStream::plan() const { return state_->loop.plan(); }

// Note [Planning draws nothing]: a call's step begins (planning, the plan's agreement, admission,
// the ledger's begin record) without swapping in the model stream: none of it draws a random
// number or runs the caller's code, so the caller's generators and the model stream are what they
// were either way, and the swap (two captures and two restores of the default generators) would
// be pure cost on the path before the first forward. Where the caller's code runs (the forward,
// the memory probe), MicrobatchStream::Next enters the scope. trainer_contract_test holds both
// streams unchanged across ForwardMicrobatches.
absl::StatusOr<MicrobatchStream> TrainerRank::ForwardMicrobatches(TrainerInputs inputs) {
  LOCKSTEP_RETURN_IF_ERROR(CallerStateLive(*core_, "ForwardMicrobatches"));
  absl::StatusOr<admission::RecoveryLoop> loop = core_->BeginStep(inputs, false);
  if (!loop.ok()) return loop.status();
  return MicrobatchStream(std::make_unique<internal::StreamState>(
      internal::StreamState{core_, *std::move(loop), std::move(inputs), false}));
}

absl::StatusOr<std::optional<MicrobatchOutput>> MicrobatchStream::Next() {
  internal::StreamState& s = *state_;
  if (s.failed || s.loop.done()) return std::optional<MicrobatchOutput>();
  std::shared_ptr<internal::TrainerCore> core = s.core.lock();
  absl::StatusOr<internal::RanMicrobatch> ran = [&]() -> absl::StatusOr<internal::RanMicrobatch> {
    if (core == nullptr) {
      return absl::FailedPreconditionError(
          "MicrobatchStream::Next: the TrainerRank that made this stream was destroyed");
    }
    LOCKSTEP_RETURN_IF_ERROR(CallerStateLive(*core, "Next()"));
    LOCKSTEP_ASSIGN_OR_RETURN(std::optional<rng::ModelStreamScope> scope, core->EnterModelStream());
    // Note [Hand-back rule]: the scope ends and the caller is synchronized once the forward is
    // queued and its outcome agreed, before the gather.
    auto hand_back = [&]() -> absl::Status {
      LOCKSTEP_RETURN_IF_ERROR(scope.has_value() ? scope->Exit() : absl::OkStatus());
      return core->HandBack(internal::HandBackPoint::kMicrobatch,
                            absl::StrCat("after a microbatch of step ", s.loop.step()));
    };
    absl::StatusOr<internal::RanMicrobatch> run =
        core->RunNext(s.loop, s.inputs, hand_back, /*scope_fresh=*/true);
    LOCKSTEP_RETURN_IF_ERROR(scope.has_value() ? scope->Exit()
                                               : absl::OkStatus());  // no-op if ended
    if (!run.ok()) return run.status();
    // Handed back: the microbatch completed; the call's last one commits the step.
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(s.loop.Complete(run->wave), core->Where("Next()"));
    if (s.loop.done())
      LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(s.loop.Commit(), core->Where("Next()"));
    return run;
  }();
  if (!ran.ok()) {
    s.failed = true;
    return ran.status();
  }
  return std::optional<MicrobatchOutput>(std::move(ran->output));
}

absl::StatusOr<std::vector<MicrobatchOutput>> TrainerRank::ForwardAllMicrobatches(
    TrainerInputs inputs) {
  LOCKSTEP_RETURN_IF_ERROR(CallerStateLive(*core_, "ForwardAllMicrobatches"));
  std::vector<internal::RanMicrobatch> ran;
  std::optional<admission::RecoveryLoop> loop;
  {
    LOCKSTEP_ASSIGN_OR_RETURN(std::optional<rng::ModelStreamScope> scope,
                              core_->EnterModelStream());
    absl::Status status = [&]() -> absl::Status {
      LOCKSTEP_ASSIGN_OR_RETURN(loop, core_->BeginStep(inputs, /*held_until_the_end=*/true));
      while (!loop->done()) {
        LOCKSTEP_ASSIGN_OR_RETURN(internal::RanMicrobatch one,
                                  core_->RunNext(*loop, inputs, nullptr, /*scope_fresh=*/false));
        ran.push_back(std::move(one));
      }
      return absl::OkStatus();
    }();
    LOCKSTEP_RETURN_IF_ERROR(scope.has_value() ? scope->Exit() : absl::OkStatus());
    LOCKSTEP_RETURN_IF_ERROR(status);
  }
  LOCKSTEP_RETURN_IF_ERROR(
      core_->HandBack(internal::HandBackPoint::kAllMicrobatches, "after ForwardAllMicrobatches"));
  // Handed back: every microbatch completed, and the step commits.
  std::vector<MicrobatchOutput> outputs;
  for (internal::RanMicrobatch& one : ran) {
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(loop->Complete(one.wave),
                                          core_->Where("ForwardAllMicrobatches"));
    outputs.push_back(std::move(one.output));
  }
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(loop->Commit(), core_->Where("ForwardAllMicrobatches"));
  return outputs;
}

absl::StatusOr<numerics::NamedTensors> TrainerRank::RegisterCustomObject(
    const std::string& name, const std::string& metadata, const CustomObjectFactory& factory) {
  LOCKSTEP_RETURN_IF_ERROR(CallerStateLive(*core_, "RegisterCustomObject"));
  return core_->RegisterCustomObject(name, metadata, factory);
}

absl::Status TrainerRank::SynchronizeCaller() {
  return core_->HandBack(internal::HandBackPoint::kExplicit, "on request");
}

absl::Status TrainerRank::SaveState(const std::string& dir, const numerics::NamedTensors& weights,
                                    const torch::optim::Optimizer* optimizer,
                                    const SaveOptions& options) {
  const std::string where = core_->Where(absl::StrCat("saving state to ", dir));
  if (core_->ledger() != nullptr) {
    // A saved state never follows a step whose record (queued) or commit could still be lost.
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(core_->ledger()->AwaitDurable(), where);
  }
  return Annotate(
      SaveTrainingState(dir, core_->streams(), core_->forward_index(), weights, optimizer, options),
      where);
}

absl::StatusOr<LoadReport> TrainerRank::LoadState(const std::string& dir,
                                                  numerics::NamedTensors& weights,
                                                  torch::optim::Optimizer* optimizer) {
  absl::StatusOr<LoadedState> loaded = LoadTrainingState(dir, core_->streams(), weights, optimizer);
  if (!loaded.ok()) {
    return Annotate(loaded.status(), core_->Where(absl::StrCat("loading state from ", dir)));
  }
  core_->set_forward_index(loaded->forward_index);
  return loaded->report;
}

int TrainerRank::cp_rank() const { return core_->cp_rank(); }
int TrainerRank::cp_size() const { return core_->cp_size(); }
rng::RankStreams& TrainerRank::streams() { return core_->streams(); }
int64_t TrainerRank::out_of_memory_recovered() const { return core_->out_of_memory_recovered(); }
const admission::MemoryModel* TrainerRank::memory_model() const { return core_->memory_model(); }

}  // namespace trainer
}  // namespace lockstep
