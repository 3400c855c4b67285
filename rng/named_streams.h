// rng/named_streams.h
//
// NamedStreamTracker keeps independent RNG streams under names ("model-parallel-rng",
// "expert-0", ...), in the spirit of Megatron's CudaRNGStatesTracker, but over the rank's whole
// default generator set (CPU, and the rank's CUDA device when it has one). Fork(name) runs a
// region on that stream: it installs the stream's state in the default generators and, when the
// region ends (also by exception), stores the stream's advanced state and puts the previous
// live state back.
//
// Add refuses a duplicate name or a duplicate seed (two streams with one seed would draw the
// same masks) with kAlreadyExists naming both. Snapshot()/Restore() copy every stream's state
// out and back as values (for activation-checkpoint recompute and exact resume).
//
// Thread-safety: one thread at a time, like the default generators it swaps.
//
// Example:
//   rng::NamedStreamTracker tracker({.cuda_device = local_rank});
//   LOCKSTEP_RETURN_IF_ERROR(tracker.Add("tensor-parallel", base_seed + 2718 + tp_rank));
//   {
//     LOCKSTEP_ASSIGN_OR_RETURN(auto fork, tracker.Fork("tensor-parallel"));
//     output = at::dropout(input, 0.1, /*train=*/true);  // draws from the named stream
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
#include "rng/generator_state.h"

namespace lockstep {
namespace rng {

class NamedStreamTracker {
 public:
  struct Stream {
    uint64_t seed = 0;
    RngSnapshot state;
  };

  explicit NamedStreamTracker(DefaultGenerators generators) : generators_(generators) {}
  NamedStreamTracker(const NamedStreamTracker&) = delete;
  NamedStreamTracker& operator=(const NamedStreamTracker&) = delete;

  const DefaultGenerators& generators() const { return generators_; }

  // Adds a stream seeded with `seed` (CPU and CUDA generators both seeded with it).
  // kAlreadyExists for a name or a seed already in use; kInvalidArgument for an empty name.
  absl::Status Add(absl::string_view name, uint64_t seed);

  // Whether a Fork scope is active.
  bool forked() const { return forked_; }

  bool Has(absl::string_view name) const { return streams_.count(std::string(name)) > 0; }
  std::vector<std::string> Names() const;

  // Every stream's current state, by name (values: later draws do not change them).
  std::map<std::string, Stream> Snapshot() const { return streams_; }
  // The streams as the tracker holds them, without a copy (valid until the tracker changes).
  const std::map<std::string, Stream>& streams() const { return streams_; }
  // Replaces every stream with `streams` (names, seeds and states). kFailedPrecondition while a
  // fork is active; kAlreadyExists if two of the given streams share a seed.
  absl::Status Restore(std::map<std::string, Stream> streams);

  // Forgets every stream. kFailedPrecondition while a fork is active.
  absl::Status Reset();

  // Runs the default generators on stream `name` until the returned scope is destroyed.
  // kNotFound for an unknown name; kFailedPrecondition while another fork is active (forks of
  // the tracker do not nest: the outer fork's saved state would be overwritten).
  class ForkScope;
  absl::StatusOr<std::unique_ptr<ForkScope>> Fork(absl::string_view name);

 private:
  DefaultGenerators generators_;
  std::map<std::string, Stream> streams_;
  bool forked_ = false;
};

class NamedStreamTracker::ForkScope {
 public:
  // Stores the stream's advanced state and restores the state that was live at Fork(). A
  // failure to do so is a broken invariant and aborts.
  ~ForkScope();
  ForkScope(const ForkScope&) = delete;
  ForkScope& operator=(const ForkScope&) = delete;

 private:
  friend class NamedStreamTracker;
  ForkScope(NamedStreamTracker& tracker, std::string name, RngSnapshot outside)
      : tracker_(tracker), name_(std::move(name)), outside_(std::move(outside)) {}

  NamedStreamTracker& tracker_;
  std::string name_;
  RngSnapshot outside_;
};

}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_NAMED_STREAMS_H_
