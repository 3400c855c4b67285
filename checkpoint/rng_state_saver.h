// checkpoint/rng_state_saver.h
//
// What an activation checkpoint records about randomness. An RngStateSaver names a set of RNG
// streams; Save() copies their current values into a SavedRngState, whose Restore() writes
// exactly those values back into the live streams. Checkpoint (checkpoint/checkpoint.h) saves
// once in forward, and in backward saves the live values, restores the forward values for the
// recompute, and restores the live values afterwards.
//
// StreamSnapshots is the implementation to use: value snapshots (rng::RngSnapshot) of the rank's
// default generators — the CPU generator and the rank's CUDA generator, graph-safe under CUDA
// graph capture — and of the named streams of the rank's rng::RankStreams (all of them, or only
// the names given). It holds a share of the RankStreams, so a saver kept by an autograd node
// keeps the streams it restores alive. Inside a CUDA graph capture on a LibTorch without graph-safe
// generator state, the CUDA half is not rewound (it cannot be): Save() records its position only so
// that CheckReplayable() can refuse stochastic work. The interface exists so that tests and qualify
// can substitute deliberately wrong savers (negative controls) and callers can add streams lockstep
// does not know about.
//
// Contract for implementations: a SavedRngState is a value (later draws do not change it);
// Restore writes all of its streams or none; ByteSize counts what it keeps alive.
//
// Thread-safety: as the streams' (one thread at a time).

#ifndef LOCKSTEP_CHECKPOINT_RNG_STATE_SAVER_H_
#define LOCKSTEP_CHECKPOINT_RNG_STATE_SAVER_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rng/generators.h"
#include "rng/rank_streams.h"
#include "rng/snapshot.h"

namespace lockstep {
namespace checkpoint {

// The values of a set of RNG streams at one point (RngStateSaver::Save), to be written back.
class SavedRngState {
 public:
  virtual ~SavedRngState() = default;

  // Writes the saved values into the live streams.
  virtual absl::Status Restore() const = 0;

  // OK if Restore() will be able to reproduce the draws made since Save(). Fails only where a
  // stream cannot be rewound in the current context (stochastic CUDA ops inside a graph capture
  // on a LibTorch without graph-safe generator state), so that a checkpoint can refuse in
  // forward, naming the cause, instead of failing in backward.
  virtual absl::Status CheckReplayable() const { return absl::OkStatus(); }

  // Bytes this object keeps alive.
  virtual size_t ByteSize() const = 0;
};

// Names a set of RNG streams and saves their current values (see the top of this file).
class RngStateSaver {
 public:
  virtual ~RngStateSaver() = default;

  // The current values of the streams this saver covers.
  virtual absl::StatusOr<std::unique_ptr<SavedRngState>> Save() const = 0;
};

// The saver to use: value snapshots of a rank's default generators and named streams.
class StreamSnapshots : public RngStateSaver {
 public:
  // The rank's default generators and its named streams named in `names` (every stream the
  // rank holds at Save() time when `names` is empty; none when the rank holds none). The saver
  // shares ownership of `streams`. A null `streams` makes every Save() fail with
  // kInvalidArgument.
  static std::shared_ptr<StreamSnapshots> Of(std::shared_ptr<rng::RankStreams> streams,
                                             std::vector<std::string> names = {});

  // kNotFound for a name the rank's named streams do not hold; kInvalidArgument without
  // streams; the snapshot errors of rng::RngSnapshot::Capture.
  absl::StatusOr<std::unique_ptr<SavedRngState>> Save() const override;

 private:
  StreamSnapshots(std::shared_ptr<rng::RankStreams> streams, std::vector<std::string> names)
      : streams_(std::move(streams)), names_(std::move(names)) {}

  std::shared_ptr<rng::RankStreams> streams_;
  std::vector<std::string> names_;
};

}  // namespace checkpoint
}  // namespace lockstep

#endif  // LOCKSTEP_CHECKPOINT_RNG_STATE_SAVER_H_
