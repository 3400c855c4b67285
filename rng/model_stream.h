// rng/model_stream.h
//
// ModelStreamScope runs library work (planning, model forward) on a private RNG stream, so the
// caller's generators neither advance nor change because of it. On entry it saves the caller's
// live state and installs the model stream; on exit — normal return, exception, any unwinding —
// it saves the advanced model stream and puts the caller's exact state back.
//
// The model stream lives in a ModelStream object and persists across scopes: each scope
// continues where the last one stopped (no replay of the same masks every forward). The first
// entry derives it from the caller's state at that moment: SHA-256 over a fixed salt and the
// caller's CPU (and CUDA) generator state gives the model stream's seeds. So two processes with
// the same caller state get the same model stream, and model draws are not correlated with the
// caller's next draws (they come from a different seed, not from the caller's sequence).
//
// Nested scopes share the stream: entering while a scope of the same ModelStream is active is a
// no-op, and only the outermost exit swaps back.
//
// The caller stays authoritative: if code inside the scope explicitly reseeds a default
// generator (manual_seed; detected per generator by its seed changing), that seed is the
// caller's and is kept on exit — that generator's state after the scope is the reseeded one,
// the model stream keeps its entry state for it, and every other generator returns to the
// caller's state as usual.
//
// Not inside CUDA graph capture: the model stream's state is an eager (seed, offset) value, which
// cannot be installed while offsets are graph-relative; entering a scope then fails with
// kFailedPrecondition and leaves the caller's state as it was.
//
// Thread-safety: one thread uses a ModelStream at a time; the default generators are
// process-global (see generator_state.h for what is out of scope).
//
// Example:
//   rng::ModelStream model_stream({.cuda_device = local_rank});
//   {
//     rng::ModelStreamScope scope(model_stream);  // caller state saved, model stream installed
//     RunPlannedWork();                             // draws come from the model stream
//   }                                               // caller state restored exactly

#ifndef LOCKSTEP_RNG_MODEL_STREAM_H_
#define LOCKSTEP_RNG_MODEL_STREAM_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rng/generator_state.h"

namespace lockstep {
namespace rng {

// The salt of the model stream's derivation. Changing it changes every model stream.
inline constexpr char kModelStreamSalt[] = "lockstep/model-stream/v1";

class ModelStream {
 public:
  explicit ModelStream(DefaultGenerators generators) : generators_(generators) {}
  ModelStream(const ModelStream&) = delete;
  ModelStream& operator=(const ModelStream&) = delete;

  const DefaultGenerators& generators() const { return generators_; }
  // The stream's state between scopes; nullopt before the first scope (and before Restore).
  const std::optional<RngSnapshot>& state() const { return state_; }
  bool in_scope() const { return depth_ > 0; }

  // Replaces the stream's state (exact resume; see stream_io.h). kFailedPrecondition inside a
  // scope; kInvalidArgument when the snapshot is of other generators.
  absl::Status Restore(std::optional<RngSnapshot> state);

  // The model stream that the caller state `caller` derives (what the first scope installs).
  static absl::StatusOr<RngSnapshot> Derive(const RngSnapshot& caller);

 private:
  friend class ModelStreamScope;

  DefaultGenerators generators_;
  std::optional<RngSnapshot> state_;
  int depth_ = 0;
};

class ModelStreamScope {
 public:
  // Saves the caller's state and installs the model stream (deriving it on first use).
  // Failure to read or write the generators is a broken invariant and aborts (CHECK); use
  // Enter() to receive it as a status instead.
  explicit ModelStreamScope(ModelStream& stream);
  // As the constructor, with errors returned.
  static absl::StatusOr<std::unique_ptr<ModelStreamScope>> Enter(ModelStream& stream);
  ~ModelStreamScope();

  ModelStreamScope(const ModelStreamScope&) = delete;
  ModelStreamScope& operator=(const ModelStreamScope&) = delete;

  // Whether this scope is the outermost one (the one that swaps the states).
  bool outermost() const { return caller_.has_value(); }

 private:
  struct NoEnter {};
  ModelStreamScope(ModelStream& stream, NoEnter) : stream_(stream) {}
  absl::Status Open();
  absl::Status Close();

  ModelStream& stream_;
  std::optional<RngSnapshot> caller_;  // set in the outermost scope only
  bool open_ = false;
};

}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_MODEL_STREAM_H_
