#include "checkpoint/rng_state_saver.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace lockstep {
namespace checkpoint {
namespace {

size_t SnapshotBytes(const rng::RngSnapshot& snapshot) { return sizeof(rng::RngSnapshot); }

class SavedStreams : public SavedRngState {
 public:
  SavedStreams(rng::RngSnapshot defaults, std::shared_ptr<rng::RankStreams> streams,
               std::map<std::string, rng::NamedStreamTracker::Stream> named)
      : defaults_(std::move(defaults)), streams_(std::move(streams)), named_(std::move(named)) {}

  absl::Status Restore() const override {
    std::map<std::string, rng::NamedStreamTracker::Stream> previous;
    const bool has_named = streams_ != nullptr && !named_.empty();
    if (has_named) {
      previous = streams_->named().Snapshot();
      std::map<std::string, rng::NamedStreamTracker::Stream> merged = previous;
      for (const auto& [name, stream] : named_) {
        auto it = merged.find(name);
        if (it == merged.end()) {
          return absl::FailedPreconditionError(absl::StrCat("named RNG stream '", name,
                                                            "' was removed from the tracker after ",
                                                            "its state was saved"));
        }
        it->second = stream;
      }
      LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(streams_->named().Restore(std::move(merged)),
                                            "while restoring named RNG streams");
    }
    absl::Status restored;
    const auto& cuda = defaults_.cuda();
    if (cuda.has_value() && !cuda->rewindable()) {
      // Inside a capture without graph-safe state the CUDA generator cannot be rewound; what was
      // saved is only a draw detector (CheckReplayable), so restore the CPU half alone.
      restored = rng::RngSnapshot::RestoreParts(defaults_.cpu(), std::nullopt);
    } else {
      restored = defaults_.Restore();
    }
    if (!restored.ok() && has_named) {
      (void)streams_->named().Restore(std::move(previous));  // all or nothing
    }
    return restored;
  }

  absl::Status CheckReplayable() const override {
    const auto& cuda = defaults_.cuda();
    if (!cuda.has_value() || cuda->rewindable()) return absl::OkStatus();
    LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot now,
                              rng::RngSnapshot::Capture(defaults_.generators()));
    if (!now.cuda().has_value() || !now.cuda()->in_capture.has_value() ||
        now.cuda()->in_capture->capture_id != cuda->in_capture->capture_id) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the CUDA graph capture of device ", cuda->device,
          " in which this checkpoint's forward began has ended or changed; a checkpoint's "
          "forward must stay inside one capture"));
    }
    const uint64_t before = cuda->in_capture->offset_intragraph;
    const uint64_t after = now.cuda()->in_capture->offset_intragraph;
    if (before == after) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "stochastic CUDA ops ran on device ", cuda->device, " inside a CUDA graph capture ",
        "(intragraph offset ", before, " -> ", after, "), and this LibTorch build has no ",
        "graph-safe generator state (graphsafe_get_state/graphsafe_set_state) to replay them in ",
        "recompute; capture only deterministic work here, or run it eagerly"));
  }

  size_t ByteSize() const override {
    size_t bytes = sizeof(*this) + SnapshotBytes(defaults_);
    for (const auto& [name, stream] : named_) bytes += name.size() + SnapshotBytes(stream.state);
    return bytes;
  }

 private:
  rng::RngSnapshot defaults_;
  std::shared_ptr<rng::RankStreams> streams_;  // null: no named streams saved
  std::map<std::string, rng::NamedStreamTracker::Stream> named_;
};

}  // namespace

std::shared_ptr<StreamSnapshots> StreamSnapshots::Of(std::shared_ptr<rng::RankStreams> streams,
                                                     std::vector<std::string> names) {
  return std::shared_ptr<StreamSnapshots>(
      new StreamSnapshots(std::move(streams), std::move(names)));
}

absl::StatusOr<std::unique_ptr<SavedRngState>> StreamSnapshots::Save() const {
  if (streams_ == nullptr) {
    return absl::InvalidArgumentError(
        "saving RNG streams for recompute: the StreamSnapshots saver was made without a "
        "RankStreams (StreamSnapshots::Of(nullptr))");
  }
  std::map<std::string, rng::NamedStreamTracker::Stream> named;
  const auto& held = streams_->named().streams();
  if (names_.empty()) {
    named = held;
  } else {
    for (const std::string& name : names_) {  // copies only the streams asked for
      auto it = held.find(name);
      if (it == held.end()) {
        return absl::NotFoundError(absl::StrCat("no named RNG stream '", name,
                                                "' in the rank's streams; it holds ", held.size(),
                                                " stream(s)"));
      }
      named.insert(*it);
    }
  }
  LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot defaults,
                            rng::RngSnapshot::Capture(streams_->generators()));
  return std::unique_ptr<SavedRngState>(
      new SavedStreams(std::move(defaults), streams_, std::move(named)));
}

}  // namespace checkpoint
}  // namespace lockstep
