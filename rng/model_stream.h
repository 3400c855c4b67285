// rng/model_stream.h
//
// The model stream: a private RNG stream on which the library does its own work (planning, model
// forward), so that the caller's generators neither advance nor change because of it. A rank's
// model stream belongs to its RankStreams (rank_streams.h); ModelStreamScope runs a region on it.
// On entry the scope saves the caller's live state and installs the model stream; on exit —
// normal return, exception, any unwinding — it saves the advanced model stream and puts the
// caller's exact state back.
//
// The model stream persists across scopes: each scope continues where the last one stopped (no
// replay of the same masks every forward). The first entry derives it from the caller's state at
// that moment: SHA-256 over a fixed salt and the caller's CPU (and CUDA) generator state gives
// the model stream's seeds. So two processes with the same caller state get the same model
// stream, and model draws are not correlated with the caller's next draws (they come from a
// different seed, not from the caller's sequence).
//
// Nested scopes share the stream: entering while a scope is active is a no-op, and only the
// outermost exit swaps back.
//
// The caller stays authoritative: if code inside the scope explicitly reseeds a default
// generator (manual_seed; detected per generator by its seed changing), that seed is the
// caller's and is kept on exit — that generator's state after the scope is the reseeded one,
// the model stream keeps its entry state for it, and every other generator returns to the
// caller's state as usual.
//
// Errors never abort: Enter returns a status (the caller's state is left as it was on failure),
// Exit returns one, and a scope destroyed without Exit leaves the stream in its destructor,
// logging (never aborting on) a failure. Not inside CUDA graph capture: the model stream's state
// is an eager (seed, offset) value, which cannot be installed while offsets are graph-relative;
// entering then fails with kFailedPrecondition.
//
// Thread-safety: as RankStreams (one thread at a time).
//
// Example:
//   {
//     LOCKSTEP_ASSIGN_OR_RETURN(rng::ModelStreamScope scope,
//                               rng::ModelStreamScope::Enter(*streams));
//     RunPlannedWork();  // draws come from the model stream
//     // Optional: the destructor exits too, but only logs a failure.
//     LOCKSTEP_RETURN_IF_ERROR(scope.Exit());
//   }

#ifndef LOCKSTEP_RNG_MODEL_STREAM_H_
#define LOCKSTEP_RNG_MODEL_STREAM_H_

#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rng/snapshot.h"

namespace lockstep {
namespace rng {

class RankStreams;

// The salt of the model stream's derivation. Changing it changes every model stream.
inline constexpr char kModelStreamSalt[] = "lockstep/model-stream/v1";

// A rank's model stream (see the top of this file): owned by its RankStreams, run on by
// ModelStreamScope.
class ModelStream {
 public:
  ModelStream(const ModelStream&) = delete;
  ModelStream& operator=(const ModelStream&) = delete;

  // The stream's state between scopes; nullopt before the first scope (and before Restore).
  const std::optional<RngSnapshot>& state() const { return state_; }
  // Whether a ModelStreamScope on it is open (the stream is installed in the generators).
  bool in_scope() const { return depth_ > 0; }

  // Replaces the stream's state (exact resume; see resume_state.h). kFailedPrecondition inside a
  // scope; kInvalidArgument when the snapshot is of other generators than the rank's.
  absl::Status Restore(std::optional<RngSnapshot> state);

  // The model stream that the caller state `caller` derives (what the first scope installs).
  static absl::StatusOr<RngSnapshot> Derive(const RngSnapshot& caller);

 private:
  friend class RankStreams;
  friend class ModelStreamScope;
  explicit ModelStream(const RankStreams& owner) : owner_(owner) {}

  const RankStreams& owner_;
  std::optional<RngSnapshot> state_;
  int depth_ = 0;
};

// A region run on the model stream: from Enter to Exit (or destruction), the rank's generators
// draw from the model stream and the caller's state is saved aside.
class ModelStreamScope {
 public:
  // Saves the caller's state and installs the rank's model stream (deriving it on first use).
  // On error the caller's state is as it was.
  static absl::StatusOr<ModelStreamScope> Enter(RankStreams& streams);

  // Takes over `other`'s open scope; `other` is then closed, and its Exit or destruction does
  // nothing.
  ModelStreamScope(ModelStreamScope&& other) noexcept;
  ModelStreamScope& operator=(ModelStreamScope&&) = delete;
  ModelStreamScope(const ModelStreamScope&) = delete;
  ModelStreamScope& operator=(const ModelStreamScope&) = delete;
  // Exits if Exit() was not called; a failure is logged, never fatal.
  ~ModelStreamScope();

  // Leaves the scope: the outermost one stores the advanced model stream and restores the
  // caller's state. Later calls do nothing and return OK.
  absl::Status Exit();

  // Whether this scope is the outermost one (the one that swaps the states).
  bool outermost() const { return caller_.has_value(); }

 private:
  explicit ModelStreamScope(std::shared_ptr<RankStreams> streams) : streams_(std::move(streams)) {}
  absl::Status Open();

  std::shared_ptr<RankStreams> streams_;  // null once exited (or moved from)
  std::optional<RngSnapshot> caller_;     // set in the outermost scope only
};

}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_MODEL_STREAM_H_
