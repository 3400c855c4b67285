#include "rng/model_stream.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/sha256.h"

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
  return RngSnapshot::Seeded(caller.generators(), DigestWord(digest, 0), DigestWord(digest, 8));
}

absl::Status ModelStream::Restore(std::optional<RngSnapshot> state) {
  if (depth_ > 0) {
    return absl::FailedPreconditionError("cannot restore a model stream while a scope is active");
  }
  if (state.has_value() && !(state->generators() == generators_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model stream state is for CUDA device ", state->generators().cuda_device,
                     ", this stream's generators use ", generators_.cuda_device));
  }
  state_ = std::move(state);
  return absl::OkStatus();
}

ModelStreamScope::ModelStreamScope(ModelStream& stream) : stream_(stream) {
  const absl::Status status = Open();
  CHECK(status.ok()) << "entering the model stream: " << status;
}

absl::StatusOr<std::unique_ptr<ModelStreamScope>> ModelStreamScope::Enter(ModelStream& stream) {
  std::unique_ptr<ModelStreamScope> scope(new ModelStreamScope(stream, NoEnter{}));
  absl::Status status = scope->Open();
  if (!status.ok()) return status;
  return scope;
}

absl::Status ModelStreamScope::Open() {
  if (stream_.depth_ > 0) {  // nested: the model stream is already installed
    ++stream_.depth_;
    open_ = true;
    return absl::OkStatus();
  }
  absl::StatusOr<RngSnapshot> caller = RngSnapshot::Capture(stream_.generators_);
  if (!caller.ok()) return caller.status();
  if (!stream_.state_.has_value()) {
    absl::StatusOr<RngSnapshot> derived = ModelStream::Derive(*caller);
    if (!derived.ok()) return derived.status();
    stream_.state_ = std::move(*derived);
  }
  if (absl::Status s = stream_.state_->Restore(); !s.ok()) {
    // Leave the caller as it was, whatever part of the install went through.
    (void)caller->Restore();
    return s;
  }
  caller_ = std::move(*caller);
  ++stream_.depth_;
  open_ = true;
  return absl::OkStatus();
}

absl::Status ModelStreamScope::Close() {
  --stream_.depth_;
  if (!caller_.has_value()) return absl::OkStatus();
  absl::StatusOr<RngSnapshot> advanced = RngSnapshot::Capture(stream_.generators_);
  if (!advanced.ok()) {
    (void)caller_->Restore();
    return advanced.status();
  }
  // A generator whose seed changed inside the scope was explicitly reseeded there: that seed
  // belongs to the caller, so the caller keeps that generator's live state and the model stream
  // keeps its entry state for it. Every other generator returns to the caller's state.
  const RngSnapshot& entry = *stream_.state_;
  const bool cpu_reseeded = advanced->cpu_seed() != entry.cpu_seed();
  const bool cuda_reseeded = advanced->cuda().has_value() && entry.cuda().has_value() &&
                             advanced->cuda()->seed != entry.cuda()->seed;
  if (!cpu_reseeded && !cuda_reseeded) {
    stream_.state_ = std::move(*advanced);
    return caller_->Restore();
  }
  const RngSnapshot& cpu_live = cpu_reseeded ? *advanced : *caller_;
  const RngSnapshot& cuda_live = cuda_reseeded ? *advanced : *caller_;
  const RngSnapshot& cpu_model = cpu_reseeded ? entry : *advanced;
  const RngSnapshot& cuda_model = cuda_reseeded ? entry : *advanced;
  absl::StatusOr<RngSnapshot> model =
      RngSnapshot::FromParts(cpu_model.cpu_state(), cuda_model.cuda());
  if (!model.ok()) {
    (void)caller_->Restore();
    return model.status();
  }
  stream_.state_ = std::move(*model);
  return RngSnapshot::RestoreParts(cpu_live.cpu_state(), cuda_live.cuda());
}

ModelStreamScope::~ModelStreamScope() {
  if (!open_) return;
  const absl::Status status = Close();
  CHECK(status.ok()) << "leaving the model stream: " << status;
}

}  // namespace rng
}  // namespace lockstep
