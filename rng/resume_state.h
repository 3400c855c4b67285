// rng/resume_state.h
//
// The RNG part of a rank's resume state: every RNG stream of a rank — the caller's live default
// generators, the model stream, and every named stream — captured from its RankStreams into one
// RngResumeStateProto (which the caller writes into its training checkpoint, beside the model
// weights) and restored from it. A run killed after step k and restarted from the resume state
// of step k then draws exactly the masks the uninterrupted run draws.
//
// Vocabulary: "resume state" is what a restarted run continues from; "activation checkpoint"
// (checkpoint/) is recompute of a block's activations in backward. Nothing here does I/O.
//
// Restore validates the whole message before changing anything (version, CUDA device, state
// sizes, seeds), so a bad resume state leaves every stream as it was.
//
// Thread-safety: as RankStreams.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(rng::RngResumeStateProto saved, rng::CaptureResumeState(*streams));
//   ... write saved.SerializeAsString() with the model weights ...
//   LOCKSTEP_RETURN_IF_ERROR(rng::RestoreResumeState(saved, *streams));

#ifndef LOCKSTEP_RNG_RESUME_STATE_H_
#define LOCKSTEP_RNG_RESUME_STATE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rng/rank_streams.h"
#include "rng/resume_state.pb.h"

namespace lockstep {
namespace rng {

inline constexpr uint32_t kRngResumeStateVersion = 1;

// Captures the caller's live state, the model stream's state and every named stream.
// kFailedPrecondition while a model-stream scope or named-stream fork is active (the live state
// is then not the caller's) and during CUDA graph capture.
absl::StatusOr<RngResumeStateProto> CaptureResumeState(const RankStreams& streams);

// Installs `saved` into the live default generators, the model stream and the named streams.
// kInvalidArgument (nothing changed) for an unknown version, another CUDA device, malformed
// states or duplicate names/seeds; kFailedPrecondition inside a scope or fork.
absl::Status RestoreResumeState(const RngResumeStateProto& saved, RankStreams& streams);

}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_RESUME_STATE_H_
