#include "checkpoint/rng_state_saver.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace lockstep {
namespace checkpoint {
namespace {

size_t SnapshotBytes(const rng::RngSnapshot& snapshot) {
  return sizeof(rng::RngSnapshot) + snapshot.cpu_state().size();
}

class SavedStreams : public SavedRngState {
 public:
  SavedStreams(rng::RngSnapshot defaults, rng::NamedStreamTracker* tracker,
               std::map<std::string, rng::NamedStreamTracker::Stream> named)
      : defaults_(std::move(defaults)), tracker_(tracker), named_(std::move(named)) {}

  absl::Status Restore() const override {
    std::map<std::string, rng::NamedStreamTracker::Stream> previous;
    if (tracker_ != nullptr && !named_.empty()) {
      previous = tracker_->Snapshot();
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
      LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(tracker_->Restore(std::move(merged)),
                                            "while restoring named RNG streams");
    }
    absl::Status restored;
    const auto& cuda = defaults_.cuda();
    if (cuda.has_value() && !cuda->rewindable()) {
      // Inside a capture without graph-safe state the CUDA generator cannot be rewound; what was
      // saved is only a draw detector (CheckReplayable), so restore the CPU half alone.
      restored = rng::RngSnapshot::RestoreParts(defaults_.cpu_state(), std::nullopt);
    } else {
      restored = defaults_.Restore();
    }
    if (!restored.ok() && tracker_ != nullptr && !named_.empty()) {
      (void)tracker_->Restore(std::move(previous));  // all or nothing
    }
    return restored;
  }

  absl::Status CheckReplayable() const override {
    const auto& cuda = defaults_.cuda();
    if (!cuda.has_value() || cuda->rewindable()) return absl::OkStatus();
    LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot now,
                              rng::RngSnapshot::Capture(defaults_.generators()));
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
  rng::NamedStreamTracker* tracker_;
  std::map<std::string, rng::NamedStreamTracker::Stream> named_;
};

}  // namespace

StreamSnapshots::StreamSnapshots(rng::DefaultGenerators generators,
                                 rng::NamedStreamTracker* tracker, std::vector<std::string> names)
    : generators_(generators), tracker_(tracker), names_(std::move(names)) {}

absl::StatusOr<std::unique_ptr<SavedRngState>> StreamSnapshots::Save() const {
  std::map<std::string, rng::NamedStreamTracker::Stream> named;
  if (tracker_ != nullptr) {
    if (!(tracker_->generators() == generators_)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the named-stream tracker uses CUDA device ", tracker_->generators().cuda_device,
          ", the checkpoint's generators use ", generators_.cuda_device));
    }
    const auto& held = tracker_->streams();
    if (names_.empty()) {
      named = held;
    } else {
      for (const std::string& name : names_) {  // copies only the streams asked for
        auto it = held.find(name);
        if (it == held.end()) {
          return absl::NotFoundError(absl::StrCat("no named RNG stream '", name,
                                                  "' in the tracker; it holds ", held.size(),
                                                  " stream(s)"));
        }
        named.insert(*it);
      }
    }
  }
  LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot defaults, rng::RngSnapshot::Capture(generators_));
  return std::unique_ptr<SavedRngState>(
      new SavedStreams(std::move(defaults), tracker_, std::move(named)));
}

}  // namespace checkpoint
}  // namespace lockstep
