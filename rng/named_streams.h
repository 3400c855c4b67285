// rng/named_streams.h
//
// NamedStreamTracker keeps independent RNG streams of a rank under names ("model-parallel-rng",
// "expert-0", ...), in the spirit of Megatron's CudaRNGStatesTracker, but over the rank's whole
// default generator set (CPU, and the rank's CUDA device when it has one). A rank's tracker
// belongs to its RankStreams (rank_streams.h). Fork(name) runs a region on that stream: it
// installs the stream's state in the default generators and, when the region ends (Exit, or the
// fork's destruction, also by exception), stores the stream's advanced state and puts the
// previous live state back.
//
// Add refuses a duplicate name or a duplicate seed (two streams with one seed would draw the
// same masks) with kAlreadyExists naming both. Snapshot()/Restore() copy every stream's state
// out and back as values (for activation-checkpoint recompute and resume state).
//
// Errors never abort: Fork returns a status, and a fork destroyed without Exit logs (never
// aborts on) a failure to put the previous state back.
//
// Thread-safety: as RankStreams (one thread at a time).
//
// Example:
//   LOCKSTEP_RETURN_IF_ERROR(
//       streams->named().Add("tensor-parallel", base_seed + 2718 + tp_rank));
//   {
//     LOCKSTEP_ASSIGN_OR_RETURN(rng::NamedStreamFork fork,
//                               streams->named().Fork("tensor-parallel"));
//     // Draws from the named stream:
//     output = at::dropout(input, 0.1, /*train=*/true);
//     LOCKSTEP_RETURN_IF_ERROR(fork.Exit());  // optional: the destructor exits too
//   }

#ifndef LOCKSTEP_RNG_NAMED_STREAMS_H_
#define LOCKSTEP_RNG_NAMED_STREAMS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "rng/snapshot.h"

namespace lockstep {
namespace rng {

class RankStreams;
class NamedStreamFork;

// The most named streams a rank holds. Each stream is a full generator state (2.5 KiB on CPU):
// this limit and kMaxStreamNameBytes bound what a rank keeps and what a resume state may ask a
// restoring rank to allocate.
inline constexpr int kMaxNamedStreams = 1024;
// The longest stream name, in bytes (CheckStreamName).
inline constexpr int kMaxStreamNameBytes = 256;

// kInvalidArgument for an empty name or one longer than kMaxStreamNameBytes, naming its length.
absl::Status CheckStreamName(absl::string_view name);

// A rank's named RNG streams (see the top of this file), owned by its RankStreams.
class NamedStreamTracker {
 public:
  // One named stream.
  struct Stream {
    // The seed it was added with (both the CPU and the CUDA generator were seeded with it).
    uint64_t seed = 0;
    // Its current state: where its next draws continue from.
    RngSnapshot state;
  };

  NamedStreamTracker(const NamedStreamTracker&) = delete;
  NamedStreamTracker& operator=(const NamedStreamTracker&) = delete;

  // Adds a stream seeded with `seed` (CPU and CUDA generators both seeded with it).
  // kAlreadyExists for a name or a seed already in use; kInvalidArgument for a name
  // CheckStreamName refuses; kResourceExhausted when kMaxNamedStreams streams exist already.
  absl::Status Add(absl::string_view name, uint64_t seed);

  // Whether a fork is active.
  bool forked() const { return forked_; }

  // Whether a stream named `name` exists.
  bool Has(absl::string_view name) const { return streams_.count(std::string(name)) > 0; }
  // The streams' names, sorted.
  std::vector<std::string> Names() const;

  // Every stream's current state, by name (values: later draws do not change them).
  std::map<std::string, Stream> Snapshot() const { return streams_; }
  // The streams as the tracker holds them, without a copy (valid until the tracker changes).
  const std::map<std::string, Stream>& streams() const { return streams_; }
  // Replaces every stream with `streams` (names, seeds and states). kFailedPrecondition while a
  // fork is active; kAlreadyExists if two of the given streams share a seed; kInvalidArgument for
  // more than kMaxNamedStreams streams, a name CheckStreamName refuses, or a state of other
  // generators than the rank's.
  absl::Status Restore(std::map<std::string, Stream> streams);

  // Forgets every stream. kFailedPrecondition while a fork is active.
  absl::Status Reset();

  // Runs the default generators on stream `name` until the fork exits. kNotFound for an unknown
  // name; kFailedPrecondition while another fork is active (forks do not nest: the outer fork's
  // captured state would be overwritten).
  absl::StatusOr<NamedStreamFork> Fork(absl::string_view name);

 private:
  friend class RankStreams;
  friend class NamedStreamFork;
  explicit NamedStreamTracker(RankStreams& owner) : owner_(owner) {}

  RankStreams& owner_;
  std::map<std::string, Stream> streams_;
  bool forked_ = false;
};

// A region running on a named stream (see NamedStreamTracker::Fork).
class NamedStreamFork {
 public:
  // Takes over `other`'s active fork; `other`'s Exit or destruction then does nothing.
  NamedStreamFork(NamedStreamFork&& other) noexcept;
  NamedStreamFork& operator=(NamedStreamFork&&) = delete;
  NamedStreamFork(const NamedStreamFork&) = delete;
  NamedStreamFork& operator=(const NamedStreamFork&) = delete;
  // Exits if Exit() was not called; a failure is logged, never fatal.
  ~NamedStreamFork();

  // Stores the stream's advanced state and restores the state that was live at Fork(). Later
  // calls do nothing and return OK.
  absl::Status Exit();

 private:
  friend class NamedStreamTracker;
  NamedStreamFork(std::shared_ptr<RankStreams> streams, std::string name, RngSnapshot outside)
      : streams_(std::move(streams)), name_(std::move(name)), outside_(std::move(outside)) {}

  std::shared_ptr<RankStreams> streams_;  // null once exited (or moved from)
  std::string name_;
  RngSnapshot outside_;
};

}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_NAMED_STREAMS_H_
