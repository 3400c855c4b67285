// Fuzz target (base/fuzz_target.h) for sealed RNG resume states (rng/resume_state.h).
//
// The first input byte picks what the rest is: even, the sealed bytes themselves (mutation then
// exercises the seal: random changes practically never keep the checksum right); odd, a payload
// that this target seals with the right checksum and stream list, so that mutation reaches the
// checks behind the seal and RestoreResumeState.
//
// Oracle: ParseResumeState returns kDataLoss, kInvalidArgument or a state; an accepted state
// re-seals to the very bytes it came from; RestoreResumeState either fails with
// kInvalidArgument leaving the live generator as it was, or succeeds, and then a second restore
// of the same state draws exactly what the first did on every stream (caller, model, named).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/fuzz_target.h"
#include "rng/internal/resume_envelope.h"
#include "rng/resume_state.h"

namespace lockstep {
namespace rng {
namespace {

std::shared_ptr<RankStreams> FreshStreams() {
  absl::StatusOr<std::shared_ptr<RankStreams>> streams =
      RankStreams::Create(DefaultGenerators::CpuOnly());
  LOCKSTEP_FUZZ_CHECK(streams.ok(), streams.status().ToString());
  return *streams;
}

// Draws from every stream the state holds (the model stream and each named stream).
at::Tensor DrawEverywhere(RankStreams& streams) {
  std::vector<at::Tensor> draws = {at::rand({8}, at::kDouble)};
  {
    absl::StatusOr<ModelStreamScope> scope = ModelStreamScope::Enter(streams);
    LOCKSTEP_FUZZ_CHECK(scope.ok(), scope.status().ToString());
    draws.push_back(at::rand({8}, at::kDouble));
  }
  for (const std::string& name : streams.named().Names()) {
    absl::StatusOr<NamedStreamFork> fork = streams.named().Fork(name);
    LOCKSTEP_FUZZ_CHECK(fork.ok(), fork.status().ToString());
    draws.push_back(at::rand({2}, at::kDouble));
  }
  draws.push_back(at::randn({3}, at::kDouble));
  return at::cat(draws);
}

// The envelope SerializeResumeState would write around `payload`, stream list derived from the
// payload when it parses.
std::string Seal(const std::string& payload) {
  RngResumeStateEnvelope envelope;
  envelope.set_format(kRngResumeEnvelopeFormat);
  envelope.add_streams("caller");
  RngResumeStateProto parsed;
  if (parsed.ParseFromString(payload)) {
    if (parsed.has_model()) envelope.add_streams("model");
    for (const NamedStreamProto& named : parsed.named()) {
      envelope.add_streams(absl::StrCat("named/", named.name()));
    }
  }
  envelope.set_payload(payload);
  envelope.set_sha256(internal::ResumeEnvelopeDigest(envelope));
  return envelope.SerializeAsString();
}

void CheckInput(const std::string& bytes) {
  absl::StatusOr<RngResumeStateProto> parsed = ParseResumeState(bytes);
  if (!parsed.ok()) {
    const absl::StatusCode code = parsed.status().code();
    LOCKSTEP_FUZZ_CHECK(
        code == absl::StatusCode::kDataLoss || code == absl::StatusCode::kInvalidArgument,
        parsed.status().ToString());
    return;
  }
  absl::StatusOr<std::string> resealed = SerializeResumeState(*parsed);
  LOCKSTEP_FUZZ_CHECK(resealed.ok() && *resealed == bytes,
                      "an accepted resume state does not re-seal to its own bytes");
  std::shared_ptr<RankStreams> streams = FreshStreams();
  at::manual_seed(1);
  absl::StatusOr<RngSnapshot> before = RngSnapshot::Capture({});
  LOCKSTEP_FUZZ_CHECK(before.ok(), before.status().ToString());
  const absl::Status restored = RestoreResumeState(*parsed, *streams);
  if (!restored.ok()) {
    LOCKSTEP_FUZZ_CHECK(restored.code() == absl::StatusCode::kInvalidArgument, restored.ToString());
    absl::StatusOr<RngSnapshot> after = RngSnapshot::Capture({});
    LOCKSTEP_FUZZ_CHECK(after.ok() && *after == *before,
                        "a refused resume state changed the live generator");
    return;
  }
  const at::Tensor first = DrawEverywhere(*streams);
  std::shared_ptr<RankStreams> again = FreshStreams();
  const absl::Status restored_again = RestoreResumeState(*parsed, *again);
  LOCKSTEP_FUZZ_CHECK(restored_again.ok(), restored_again.ToString());
  const at::Tensor second = DrawEverywhere(*again);
  LOCKSTEP_FUZZ_CHECK(at::equal(first, second),
                      "two restores of one resume state drew different values");
}

}  // namespace
}  // namespace rng

std::vector<std::string> FuzzSeeds() {
  std::vector<std::string> seeds;
  // A captured state: both forms of it, or an abort naming why it could not be captured.
  auto add = [&](const absl::StatusOr<rng::RngResumeStateProto>& saved) {
    LOCKSTEP_FUZZ_CHECK(saved.ok(), saved.status().ToString());
    absl::StatusOr<std::string> sealed = rng::SerializeResumeState(*saved);
    LOCKSTEP_FUZZ_CHECK(sealed.ok(), sealed.status().ToString());
    seeds.push_back(std::string(1, '\0') + *sealed);
    seeds.push_back(std::string(1, '\1') + saved->SerializeAsString());
  };
  at::manual_seed(3);
  std::shared_ptr<rng::RankStreams> streams = rng::FreshStreams();
  add(rng::CaptureResumeState(*streams));  // the caller only
  LOCKSTEP_FUZZ_CHECK(streams->named().Add("tp", 17).ok(), "Add");
  LOCKSTEP_FUZZ_CHECK(streams->named().Add("expert-3", 18).ok(), "Add");
  (void)rng::DrawEverywhere(*streams);  // derives the model stream
  add(rng::CaptureResumeState(*streams));
  return seeds;
}

}  // namespace lockstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  lockstep::rng::CheckInput(data[0] % 2 == 0 ? rest : lockstep::rng::Seal(rest));
  return 0;
}
