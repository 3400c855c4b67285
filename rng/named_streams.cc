#include "rng/named_streams.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "rng/rank_streams.h"

namespace lockstep {
namespace rng {

absl::Status CheckStreamName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("a named stream needs a non-empty name");
  if (name.size() > static_cast<size_t>(kMaxStreamNameBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("a named stream's name of ", name.size(),
                                                   " bytes exceeds the limit of ",
                                                   kMaxStreamNameBytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status NamedStreamTracker::Add(absl::string_view name, uint64_t seed) {
  LOCKSTEP_RETURN_IF_ERROR(CheckStreamName(name));
  if (streams_.size() >= static_cast<size_t>(kMaxNamedStreams)) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot add named stream '", name,
                                                     "': the rank already holds the limit of ",
                                                     kMaxNamedStreams, " named streams"));
  }
  if (Has(name)) {
    return absl::AlreadyExistsError(absl::StrCat("named stream '", name, "' already exists"));
  }
  for (const auto& [other, stream] : streams_) {
    if (stream.seed == seed) {
      return absl::AlreadyExistsError(absl::StrCat("seed ", seed, " of named stream '", name,
                                                   "' is already used by '", other,
                                                   "'; the two would draw identical values"));
    }
  }
  absl::StatusOr<RngSnapshot> state = RngSnapshot::Seeded(owner_.generators(), seed, seed);
  if (!state.ok()) return state.status();
  streams_.emplace(std::string(name), Stream{seed, std::move(*state)});
  return absl::OkStatus();
}

std::vector<std::string> NamedStreamTracker::Names() const {
  std::vector<std::string> names;
  for (const auto& entry : streams_) names.push_back(entry.first);
  return names;
}

absl::Status NamedStreamTracker::Restore(std::map<std::string, Stream> streams) {
  if (forked_) return absl::FailedPreconditionError("cannot restore streams during a fork");
  if (streams.size() > static_cast<size_t>(kMaxNamedStreams)) {
    return absl::InvalidArgumentError(
        absl::StrCat(streams.size(), " named streams exceed the limit of ", kMaxNamedStreams));
  }
  std::map<uint64_t, std::string> seeds;
  for (const auto& [name, stream] : streams) {
    LOCKSTEP_RETURN_IF_ERROR(CheckStreamName(name));
    auto [it, inserted] = seeds.emplace(stream.seed, name);
    if (!inserted) {
      return absl::AlreadyExistsError(absl::StrCat("named streams '", it->second, "' and '", name,
                                                   "' share seed ", stream.seed));
    }
    if (absl::Status s =
            owner_.CheckGenerators(stream.state, absl::StrCat("named stream '", name, "'"));
        !s.ok()) {
      return s;
    }
  }
  streams_ = std::move(streams);
  return absl::OkStatus();
}

absl::Status NamedStreamTracker::Reset() {
  if (forked_) return absl::FailedPreconditionError("cannot reset streams during a fork");
  streams_.clear();
  return absl::OkStatus();
}

absl::StatusOr<NamedStreamFork> NamedStreamTracker::Fork(absl::string_view name) {
  auto it = streams_.find(std::string(name));
  if (it == streams_.end()) {
    return absl::NotFoundError(absl::StrCat("no named stream '", name, "'"));
  }
  if (forked_) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot fork '", name, "': another named stream is forked"));
  }
  absl::StatusOr<RngSnapshot> outside = RngSnapshot::Capture(owner_.generators());
  if (!outside.ok()) return outside.status();
  if (absl::Status s = it->second.state.Restore(); !s.ok()) {
    (void)outside->Restore();
    return s;
  }
  forked_ = true;
  return NamedStreamFork(owner_.shared_from_this(), it->first, std::move(*outside));
}

NamedStreamFork::NamedStreamFork(NamedStreamFork&& other) noexcept
    : streams_(std::move(other.streams_)),
      name_(std::move(other.name_)),
      outside_(std::move(other.outside_)) {
  other.streams_ = nullptr;
}

absl::Status NamedStreamFork::Exit() {
  if (streams_ == nullptr) return absl::OkStatus();
  std::shared_ptr<RankStreams> streams = std::move(streams_);
  streams_ = nullptr;
  NamedStreamTracker& tracker = streams->named();
  tracker.forked_ = false;
  absl::StatusOr<RngSnapshot> advanced = RngSnapshot::Capture(streams->generators());
  absl::Status saved = advanced.status();
  if (advanced.ok()) {
    auto it = tracker.streams_.find(name_);
    if (it != tracker.streams_.end()) it->second.state = std::move(*advanced);
  }
  const absl::Status restored = outside_.Restore();
  if (!saved.ok()) {
    return Annotate(saved, absl::StrCat("while saving named stream '", name_, "'"));
  }
  if (!restored.ok()) {
    return Annotate(
        restored, absl::StrCat("while restoring the state live before named stream '", name_, "'"));
  }
  return absl::OkStatus();
}

NamedStreamFork::~NamedStreamFork() {
  if (absl::Status s = Exit(); !s.ok()) LOCKSTEP_LOG(ERROR) << s;
}

}  // namespace rng
}  // namespace lockstep
