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
  if (advanced->cpu_seed() != stream_.state_->cpu_seed()) {
    // Explicitly reseeded inside the scope: that seed belongs to the caller. Keep the live state
    // as the caller's, and the model stream as it was on entry.
    return absl::OkStatus();
  }
  stream_.state_ = std::move(*advanced);
  return caller_->Restore();
}

ModelStreamScope::~ModelStreamScope() {
  if (!open_) return;
  const absl::Status status = Close();
  CHECK(status.ok()) << "leaving the model stream: " << status;
}

}  // namespace rng
}  // namespace lockstep
