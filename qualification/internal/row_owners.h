// qualification/internal/row_owners.h
//
// Private to qualification/: the evidence of the trainer oracle's replica_outputs check.
//
// Note [Rows against their owners]: after a hand-back every member of a TP x CP group holds the
// microbatch's full outputs, each CP rank's rows gathered from the members that computed them.
// Comparing the members' full outputs cannot fail at TP 1, where every row has one owner and
// every member's copy of it is the owner's, moved byte for byte. So each rank digests the rows
// its forward computed (its CP shard) before the gather, and after each hand-back the rows at
// every CP rank's shard in what it received; replica_outputs then checks that every member
// received each CP rank's rows as that CP rank's members computed them, and that TP replicas of
// a CP rank computed the same rows.
//
// Thread-safety: one thread (the rank's training loop).

#ifndef LOCKSTEP_QUALIFICATION_INTERNAL_ROW_OWNERS_H_
#define LOCKSTEP_QUALIFICATION_INTERNAL_ROW_OWNERS_H_

#include <deque>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "collectives/topology.h"
#include "trainer/shard_work.h"
#include "trainer/trainer_config.h"

namespace lockstep {
namespace qualification {
namespace internal {

// The SHA-256 of `rows`' bytes (a byte tensor of 32), whatever their device.
at::Tensor RowsDigest(const at::Tensor& rows);

// One rank's digests, per hand-back in order: uint8 [(1 + cp_size) * 32], the digest of the rows
// this rank computed, then of the rows received at each CP rank's shard.
class RowOwnership {
 public:
  // `forward` with the digest of each call's rows recorded before the trainer gathers them.
  // Precondition: this object outlives the returned adapter.
  trainer::ForwardAdapter Wrap(trainer::ForwardAdapter forward);

  // Records the digests of the rows `out` holds at each CP rank's shard; hand-backs come in the
  // order of their forward calls (kInternal otherwise).
  absl::Status Received(const trainer::MicrobatchOutput& out);

  const std::vector<at::Tensor>& digests() const { return digests_; }

 private:
  // What one forward call computed, kept until its hand-back.
  struct ComputedShard {
    int microbatch = 0;
    at::Tensor own;                                // RowsDigest of the shard's rows
    std::vector<std::vector<int64_t>> rows_by_cp;  // each CP rank's packed offsets
  };
  std::deque<ComputedShard> computed_;
  std::vector<at::Tensor> digests_;
};

// Over the TP x CP `group` (null: nothing to compare), whether every member received each CP
// rank's rows as that CP rank's members computed them, from every member's `digests`
// (RowOwnership::digests). Empty when they did; otherwise what differs first. Collective.
absl::StatusOr<std::string> RowsDisagreeWithOwners(collectives::Communicator* group,
                                                   const collectives::Topology& topology,
                                                   const std::vector<at::Tensor>& digests);

}  // namespace internal
}  // namespace qualification
}  // namespace lockstep

#endif  // LOCKSTEP_QUALIFICATION_INTERNAL_ROW_OWNERS_H_
