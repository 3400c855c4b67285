// rng/resume_state.h
//
// The RNG part of a rank's resume state: every RNG stream of a rank — the caller's live default
// generators, the model stream, and every named stream — captured from its RankStreams into one
// RngResumeStateProto (which the caller stores beside the model weights in its saved state, as
// trainer::TrainerRank::SaveState does with SaveOptions::include_rng_streams) and restored from
// it. A run killed after step k and restarted from the resume state of step k then draws exactly
// the masks the uninterrupted run draws.
//
// Vocabulary: "resume state" is what a restarted run continues from; "saved state" is what
// TrainerRank::SaveState writes (weights, optimizer and, opt-in, this resume state); "activation
// checkpoint" (checkpoint/) is recompute of a block's activations in backward. Nothing here does
// I/O.
//
// Restore validates the whole message before changing anything (version, CUDA device, every
// generator state exactly as LibTorch reads it, names, seeds, the named-stream limit), so a bad
// resume state leaves every stream as it was.
//
// On disk a resume state is sealed: SerializeResumeState wraps it in an RngResumeStateEnvelope
// (format, the set of streams saved, SHA-256 over all of it), and ParseResumeState accepts only
// bytes that are exactly such an envelope: no flipped byte, no cut, nothing appended, nothing
// re-encoded. Corruption is kDataLoss; a well-sealed state this build cannot use (another
// format, too many streams, a malformed generator state) is kInvalidArgument.
//
// Thread-safety: as RankStreams.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(rng::RngResumeStateProto saved, rng::CaptureResumeState(*streams));
//   LOCKSTEP_ASSIGN_OR_RETURN(std::string bytes, rng::SerializeResumeState(saved));
//   ... write bytes with the model weights; after a restart read them back ...
//   LOCKSTEP_ASSIGN_OR_RETURN(rng::RngResumeStateProto loaded, rng::ParseResumeState(bytes));
//   LOCKSTEP_RETURN_IF_ERROR(rng::RestoreResumeState(loaded, *streams));

#ifndef LOCKSTEP_RNG_RESUME_STATE_H_
#define LOCKSTEP_RNG_RESUME_STATE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "rng/rank_streams.h"
#include "rng/resume_state.pb.h"

namespace lockstep {
namespace rng {

// The RngResumeStateProto version CaptureResumeState writes and the only one
// RestoreResumeState accepts (others are kInvalidArgument).
inline constexpr uint32_t kRngResumeStateVersion = 1;
// The RngResumeStateEnvelope format SerializeResumeState writes and the only one
// ParseResumeState accepts (others are kInvalidArgument).
inline constexpr uint32_t kRngResumeEnvelopeFormat = 1;
// The largest sealed resume state ParseResumeState reads (kMaxNamedStreams full CPU and CUDA
// states fit in well under half of it).
inline constexpr size_t kMaxResumeStateBytes = size_t{16} << 20;

// Captures the caller's live state, the model stream's state and every named stream.
// kFailedPrecondition while a model-stream scope or named-stream fork is active (the live state
// is then not the caller's) and during CUDA graph capture.
absl::StatusOr<RngResumeStateProto> CaptureResumeState(const RankStreams& streams);

// Installs `saved` into the live default generators, the model stream and the named streams.
// kInvalidArgument (nothing changed) for an unknown version, another CUDA device, malformed
// states, more than kMaxNamedStreams streams, or empty, over-long or duplicate names or seeds;
// kFailedPrecondition inside a scope or fork.
absl::Status RestoreResumeState(const RngResumeStateProto& saved, RankStreams& streams);

// A resume state checked against a rank's streams: everything RestoreResumeState refuses,
// Check refuses, and Install then changes the streams. For callers that change several things
// together (TrainerRank::LoadState: weights, optimizer, RNG streams) and must check all of them
// before changing any.
class CheckedResumeState {
 public:
  // The checks of RestoreResumeState, changing nothing.
  static absl::StatusOr<CheckedResumeState> Check(const RngResumeStateProto& saved,
                                                  RankStreams& streams);
  // Installs the state. Fails only if the live generators refuse it (then nothing changed) or a
  // scope or fork was entered since Check (kFailedPrecondition).
  absl::Status Install() &&;

 private:
  CheckedResumeState(std::shared_ptr<RankStreams> streams, RngSnapshot caller,
                     std::optional<RngSnapshot> model,
                     std::map<std::string, NamedStreamTracker::Stream> named)
      : streams_(std::move(streams)),
        caller_(std::move(caller)),
        model_(std::move(model)),
        named_(std::move(named)) {}

  std::shared_ptr<RankStreams> streams_;
  RngSnapshot caller_;
  std::optional<RngSnapshot> model_;
  std::map<std::string, NamedStreamTracker::Stream> named_;
};

// The sealed bytes of `saved`: an RngResumeStateEnvelope. kInvalidArgument for a message
// ParseResumeState would refuse on structure (unknown version, more than kMaxNamedStreams named
// streams, an empty or over-long name), so nothing unreadable is ever written.
absl::StatusOr<std::string> SerializeResumeState(const RngResumeStateProto& saved);

// The resume state sealed in `bytes`. kDataLoss, naming what does not match, unless `bytes` are
// exactly what SerializeResumeState produces for some state: larger than kMaxResumeStateBytes,
// not an envelope, not in canonical encoding (appended or re-encoded bytes), a checksum that
// does not match, a payload that does not parse canonically, or a stream set that differs from
// the payload's. kInvalidArgument for an intact envelope of another format, or a payload
// SerializeResumeState would refuse. Generator states are checked by RestoreResumeState.
absl::StatusOr<RngResumeStateProto> ParseResumeState(absl::string_view bytes);

}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_RESUME_STATE_H_
