#include "rng/named_streams.h"

#include "absl/strings/str_cat.h"
#include "base/logging.h"

namespace lockstep {
namespace rng {

absl::Status NamedStreamTracker::Add(absl::string_view name, uint64_t seed) {
  if (name.empty()) return absl::InvalidArgumentError("a named stream needs a non-empty name");
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
  absl::StatusOr<RngSnapshot> state = RngSnapshot::Seeded(generators_, seed, seed);
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
  std::map<uint64_t, std::string> seeds;
  for (const auto& [name, stream] : streams) {
    auto [it, inserted] = seeds.emplace(stream.seed, name);
    if (!inserted) {
      return absl::AlreadyExistsError(absl::StrCat("named streams '", it->second, "' and '", name,
                                                   "' share seed ", stream.seed));
    }
    if (!(stream.state.generators() == generators_)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "named stream '", name, "' holds state for CUDA device ",
          stream.state.generators().cuda_device, ", the tracker uses ", generators_.cuda_device));
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

absl::StatusOr<std::unique_ptr<NamedStreamTracker::ForkScope>> NamedStreamTracker::Fork(
    absl::string_view name) {
  auto it = streams_.find(std::string(name));
  if (it == streams_.end()) {
    return absl::NotFoundError(absl::StrCat("no named stream '", name, "'"));
  }
  if (forked_) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot fork '", name, "': another named stream is forked"));
  }
  absl::StatusOr<RngSnapshot> outside = RngSnapshot::Capture(generators_);
  if (!outside.ok()) return outside.status();
  if (absl::Status s = it->second.state.Restore(); !s.ok()) {
    (void)outside->Restore();
    return s;
  }
  forked_ = true;
  return std::unique_ptr<ForkScope>(new ForkScope(*this, it->first, std::move(*outside)));
}

NamedStreamTracker::ForkScope::~ForkScope() {
  absl::StatusOr<RngSnapshot> advanced = RngSnapshot::Capture(tracker_.generators_);
  CHECK(advanced.ok()) << "saving named stream '" << name_ << "': " << advanced.status();
  tracker_.streams_.at(name_).state = std::move(*advanced);
  tracker_.forked_ = false;
  const absl::Status restored = outside_.Restore();
  CHECK(restored.ok()) << "restoring after named stream '" << name_ << "': " << restored;
}

}  // namespace rng
}  // namespace lockstep
