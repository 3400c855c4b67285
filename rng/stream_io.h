// rng/stream_io.h
//
// Exact stochastic resume: every RNG stream of a rank — the caller's live default generators,
// the model stream, and every named stream — captured into one RngStreamsProto (to write into a
// training checkpoint) and restored from it. A run killed after step k and restarted from the
// checkpoint of step k then draws exactly the masks the uninterrupted run draws.
//
// Restore validates the whole message before changing anything (version, CUDA device, state
// sizes, seeds), so a bad checkpoint leaves every stream as it was.
//
// Thread-safety: as the default generators.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(rng::RngStreamsProto saved,
//                             rng::CaptureStreams(generators, model_stream, &tracker));
//   ... write saved.SerializeAsString() with the model weights ...
//   LOCKSTEP_RETURN_IF_ERROR(rng::RestoreStreams(saved, model_stream, &tracker));

#ifndef LOCKSTEP_RNG_STREAM_IO_H_
#define LOCKSTEP_RNG_STREAM_IO_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rng/generator_state.h"
#include "rng/model_stream.h"
#include "rng/named_streams.h"
#include "rng/rng_state.pb.h"

namespace lockstep {
namespace rng {

inline constexpr uint32_t kRngStreamsVersion = 1;

// Captures the caller's live state, `model`'s state and every stream of `tracker` (may be null).
// kFailedPrecondition while a model-stream scope is active (the live state is then the model
// stream's, not the caller's).
absl::StatusOr<RngStreamsProto> CaptureStreams(const DefaultGenerators& generators,
                                               const ModelStream& model,
                                               const NamedStreamTracker* tracker);

// Installs `saved` into the live default generators, `model` and `tracker` (may be null only if
// `saved` has no named streams). kInvalidArgument (nothing changed) for an unknown version,
// another CUDA device, malformed states or duplicate names/seeds.
absl::Status RestoreStreams(const RngStreamsProto& saved, ModelStream& model,
                            NamedStreamTracker* tracker);

}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_STREAM_IO_H_
