#include "rng/model_stream.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/sha256.h"
#include "rng/rank_streams.h"

namespace lockstep {
namespace rng {

absl::StatusOr<RngSnapshot> ModelStream::Derive(const RngSnapshot& caller) {
  std::string cuda_part;
  if (caller.cuda().has_value() && caller.cuda()->in_capture.has_value()) {
    return absl::FailedPreconditionError(
        "cannot derive the model stream during CUDA graph capture: the caller's CUDA generator "
        "position is graph-relative; enter the model stream once before capturing");
  }
  if (caller.cuda().has_value()) {
    absl::StrAppend(&cuda_part, caller.cuda()->seed, "/", caller.cuda()->offset);
  }
  const Sha256Digest digest = Sha256Framed({kModelStreamSalt, caller.cpu_state(), cuda_part});
  return RngSnapshot::Seeded(caller.generators(), DigestWord<0>(digest), DigestWord<8>(digest));
}

absl::Status ModelStream::Restore(std::optional<RngSnapshot> state) {
  if (depth_ > 0) {
    return absl::FailedPreconditionError("cannot restore a model stream while a scope is active");
  }
  if (state.has_value()) {
    if (absl::Status s = owner_.CheckGenerators(*state, "the model stream state"); !s.ok()) {
      return s;
    }
  }
  state_ = std::move(state);
  return absl::OkStatus();
}

absl::StatusOr<ModelStreamScope> ModelStreamScope::Enter(RankStreams& streams) {
  ModelStreamScope scope(streams.shared_from_this());
  if (absl::Status s = scope.Open(); !s.ok()) {
    scope.streams_ = nullptr;  // nothing to exit
    return s;
  }
  return scope;
}

ModelStreamScope::ModelStreamScope(ModelStreamScope&& other) noexcept
    : streams_(std::move(other.streams_)), caller_(std::move(other.caller_)) {
  other.streams_ = nullptr;
  other.caller_.reset();
}

absl::Status ModelStreamScope::Open() {
  ModelStream& stream = streams_->model();
  if (stream.depth_ > 0) {  // nested: the model stream is already installed
    ++stream.depth_;
    return absl::OkStatus();
  }
  absl::StatusOr<RngSnapshot> caller = RngSnapshot::Capture(streams_->generators());
  if (!caller.ok()) return caller.status();
  if (!stream.state_.has_value()) {
    absl::StatusOr<RngSnapshot> derived = ModelStream::Derive(*caller);
    if (!derived.ok()) return derived.status();
    stream.state_ = std::move(*derived);
  }
  if (absl::Status s = stream.state_->Restore(); !s.ok()) {
    // Leave the caller as it was, whatever part of the install went through.
    (void)caller->Restore();
    return s;
  }
  caller_ = std::move(*caller);
  ++stream.depth_;
  return absl::OkStatus();
}

absl::Status ModelStreamScope::Exit() {
  if (streams_ == nullptr) return absl::OkStatus();
  std::shared_ptr<RankStreams> streams = std::move(streams_);
  streams_ = nullptr;
  ModelStream& stream = streams->model();
  --stream.depth_;
  if (!caller_.has_value()) return absl::OkStatus();
  const RngSnapshot caller = std::move(*caller_);
  caller_.reset();
  absl::StatusOr<RngSnapshot> advanced = RngSnapshot::Capture(streams->generators());
  if (!advanced.ok()) {
    (void)caller.Restore();
    return advanced.status();
  }
  // A generator whose seed changed inside the scope was explicitly reseeded there: that seed
  // belongs to the caller, so the caller keeps that generator's live state and the model stream
  // keeps its entry state for it. Every other generator returns to the caller's state.
  const RngSnapshot& entry = *stream.state_;
  const bool cpu_reseeded = advanced->cpu_seed() != entry.cpu_seed();
  const bool cuda_reseeded = advanced->cuda().has_value() && entry.cuda().has_value() &&
                             advanced->cuda()->seed != entry.cuda()->seed;
  if (!cpu_reseeded && !cuda_reseeded) {
    stream.state_ = std::move(*advanced);
    return caller.Restore();
  }
  const RngSnapshot& cpu_live = cpu_reseeded ? *advanced : caller;
  const RngSnapshot& cuda_live = cuda_reseeded ? *advanced : caller;
  const RngSnapshot& cpu_model = cpu_reseeded ? entry : *advanced;
  const RngSnapshot& cuda_model = cuda_reseeded ? entry : *advanced;
  absl::StatusOr<RngSnapshot> model = RngSnapshot::FromState(cpu_model.cpu(), cuda_model.cuda());
  if (!model.ok()) {
    (void)caller.Restore();
    return model.status();
  }
  stream.state_ = std::move(*model);
  return RngSnapshot::RestoreParts(cpu_live.cpu(), cuda_live.cuda());
}

ModelStreamScope::~ModelStreamScope() {
  if (absl::Status s = Exit(); !s.ok()) {
    LOCKSTEP_LOG(ERROR) << "leaving the model stream: " << s;
  }
}

}  // namespace rng
}  // namespace lockstep
