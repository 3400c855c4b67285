// rng/rank_streams.h
//
// RankStreams is the one owner of a rank's RNG streams: the rank's default generators (which
// devices they cover), its private model stream (model_stream.h) and its named streams
// (named_streams.h). Everything that reads or writes those streams takes it — model-stream
// scopes, named-stream forks, Synchronize (synchronize.h), resume-state capture and restore
// (resume_state.h), activation-checkpoint savers (checkpoint/rng_state_saver.h) — so they can
// never be handed streams of different generators, and the one check that a snapshot belongs
// to this rank's generators (CheckGenerators) lives here.
//
// Shared ownership: RankStreams is created as a std::shared_ptr, and every object that must
// outlive a call (a scope, a fork, a saver kept by an autograd node) holds a share of it, so no
// lifetime rule is left to comments.
//
// Thread-safety: one thread uses a RankStreams at a time; the default generators it swaps are
// process-global (see snapshot.h for what is out of scope).
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(std::shared_ptr<rng::RankStreams> streams,
//       rng::RankStreams::Create(rng::DefaultGenerators::WithCudaDevice(local_rank)));
//   LOCKSTEP_RETURN_IF_ERROR(streams->named().Add("tensor-parallel", seed + tp_rank));
//   {
//     LOCKSTEP_ASSIGN_OR_RETURN(rng::ModelStreamScope scope,
//                               rng::ModelStreamScope::Enter(*streams));
//     RunPlannedWork();  // draws from the model stream
//   }  // the caller's state is back
//   LOCKSTEP_RETURN_IF_ERROR(rng::Synchronize(tp_cp_group.get(), *streams));

#ifndef LOCKSTEP_RNG_RANK_STREAMS_H_
#define LOCKSTEP_RNG_RANK_STREAMS_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "rng/generators.h"
#include "rng/model_stream.h"
#include "rng/named_streams.h"
#include "rng/snapshot.h"

namespace lockstep {
namespace rng {

// A rank's RNG streams: its default generators, model stream and named streams (see the top of
// this file). Always held by std::shared_ptr (Create).
class RankStreams : public std::enable_shared_from_this<RankStreams> {
 public:
  // The streams of a rank with `generators`. kFailedPrecondition when they include a CUDA
  // device but this build has no CUDA support.
  static absl::StatusOr<std::shared_ptr<RankStreams>> Create(DefaultGenerators generators);

  RankStreams(const RankStreams&) = delete;
  RankStreams& operator=(const RankStreams&) = delete;

  // The default generators the streams are states of (fixed at Create).
  const DefaultGenerators& generators() const { return generators_; }
  // The rank's model stream (model_stream.h).
  ModelStream& model() { return model_; }
  // The rank's model stream, read-only.
  const ModelStream& model() const { return model_; }
  // The rank's named streams (named_streams.h).
  NamedStreamTracker& named() { return named_; }
  // The rank's named streams, read-only.
  const NamedStreamTracker& named() const { return named_; }

  // Whether the live default generators hold the caller's own state: no model-stream scope and
  // no named-stream fork is active.
  bool caller_state_live() const { return !model_.in_scope() && !named_.forked(); }

  // OK when `snapshot` is of this rank's generators; else kInvalidArgument naming `what`, the
  // snapshot's CUDA device and this rank's.
  absl::Status CheckGenerators(const RngSnapshot& snapshot, absl::string_view what) const;
  // The same check for state recorded as generators (`what` was saved for `generators`).
  absl::Status CheckGenerators(const DefaultGenerators& generators, absl::string_view what) const;

 private:
  explicit RankStreams(DefaultGenerators generators);

  const DefaultGenerators generators_;
  ModelStream model_;
  NamedStreamTracker named_;
};

}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_RANK_STREAMS_H_
