// collectives/internal/host_lane.h
//
// HostLane: collectives on small CPU buffers among the processes of one group that share a host,
// through a shared-memory segment instead of a device. Used by NcclCommunicator for CPU tensors
// (Note [Host lane] in nccl_communicator.cc): an RNG hand-back moves ~2.5 KB of host state, and
// routing it through a GPU costs two PCIe crossings, a kernel launch and a stream wait, several
// times a shared-memory round (rng_nccl_benchmark and tools/bench/handback.sh measure both).
//
// Contract:
// - Connect is called by every member of the group with the same store key; it returns a lane
//   only when every member is on the same host (boot id), in the same IPC and PID namespaces, and
//   proved it maps the very segment the first member created — every member reads every other
//   member's random nonce in its own mapping (Note [Proof of sharing] in host_lane.cc), so a
//   forged or stale segment of the same name, or identifiers that collide between hosts, never
//   give a lane; otherwise nullptr on every member (the caller keeps its other path). The
//   segment's name is unlinked once every member has had its chance to map it, so nothing is
//   left in /dev/shm after setup (unless the first member dies during it).
// - Members call the same collectives in the same order (rounds are counted on each member);
//   each collective carries at most kMaxBytes per member and returns once this member's part
//   is complete (its output written, its input no longer needed).
// - A peer that does not arrive within the timeout makes the call kDeadlineExceeded; a peer
//   process that has exited makes it kUnavailable (checked while waiting); members that called
//   different collectives (kind, root, size or an all-gather's tag) get kFailedPrecondition on
//   the member that sees it (a broadcast's root and every all-gather member check every member's
//   call; a broadcast's receiver checks the root's). A member whose call fails marks the segment,
//   and members waiting on it then fail with kUnavailable ("gave up after an error") instead of
//   waiting out the timeout. After any error the lane refuses further calls (kFailedPrecondition).
//
// Waiting: a member spins briefly where the members have a CPU each, then sleeps on a futex in
// the segment until a peer's progress wakes it, so an oversubscribed host (more members than
// CPUs) does not lose its CPUs to spinning waiters.
//
// Thread-safety: one thread uses a lane at a time.
//
// Example (inside a communicator's setup and collective):
//   LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<HostLane> lane,
//                             HostLane::Connect(rendezvous, key, rank, size, timeout));
//   if (lane != nullptr && bytes <= HostLane::kMaxBytes) {
//     LOCKSTEP_RETURN_IF_ERROR(lane->Broadcast(data, bytes, root, "broadcast"));
//   }

#ifndef LOCKSTEP_COLLECTIVES_INTERNAL_HOST_LANE_H_
#define LOCKSTEP_COLLECTIVES_INTERNAL_HOST_LANE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/rendezvous.h"

namespace lockstep {
namespace collectives {
namespace internal {

// Tests only: `hook` runs in a member other than the first just before it opens the segment named
// `name` (a test replaces the segment there with a forged copy). nullptr: none (the default).
void SetBeforeAttachForTesting(void (*hook)(const std::string& name));

class HostLane {
 public:
  // The most bytes one member contributes to one collective.
  static constexpr int64_t kMaxBytes = 64 * 1024;

  // Sets up the lane of the group whose members share `store_key` (see the contract above).
  // Errors only when the rendezvous fails (a member did not publish in time); every other
  // obstacle means "no lane" (nullptr).
  static absl::StatusOr<std::unique_ptr<HostLane>> Connect(Rendezvous& rendezvous,
                                                           const std::string& store_key, int rank,
                                                           int size, absl::Duration timeout);

  ~HostLane();
  HostLane(const HostLane&) = delete;
  HostLane& operator=(const HostLane&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Copies `bytes` bytes at root's `data` into every member's `data`. `what` names the
  // operation in errors.
  absl::Status Broadcast(void* data, int64_t bytes, int root, const std::string& what);

  // Writes every member's `bytes` bytes at `input` into `output`, in rank order (size() * bytes
  // bytes; may not overlap `input`). `tag` (at most kMaxTag) is compared like the size: callers
  // that build other collectives on an all-gather (an all-reduce) tag them with the operation
  // and the dtype, so that members calling different ones are refused.
  static constexpr uint32_t kMaxTag = 0xffffff;
  absl::Status AllGather(const void* input, int64_t bytes, void* output, const std::string& what,
                         uint32_t tag = 0);

  // Note [Lane or group]: the lane's members must all take it or all not. A member whose CPU
  // tensor is too large for the lane (or of a kind it does not carry) announces its collective
  // here before taking the group's path: a round that moves nothing and checks that every member
  // announced the same (`bytes` per member, `tag`). So members that split between the lane and
  // the group (a size mismatch across kMaxBytes) are kFailedPrecondition on both sides, naming
  // each member's call, instead of each waiting out the timeout for the other on another path.
  absl::Status Announce(int64_t bytes, const std::string& what, uint32_t tag = 0);

 private:
  HostLane(void* mapping, size_t mapping_bytes, int rank, int size, absl::Duration timeout,
           std::vector<int64_t> pids, bool spins);

  // One round: this member writes `input` into its slot (when `writes`) and copies the slots of
  // members [first_source, last_source] into `output` (rank order, `bytes` each). It waits for
  // and checks the calls of those members, or of every member when `checks_all`.
  absl::Status Round(uint32_t kind, const void* input, bool writes, int first_source,
                     int last_source, bool checks_all, int64_t bytes, void* output,
                     const std::string& what);
  // Waits until the `field` (0: arrived, 1: done) of members [first, last] has reached `round`.
  absl::Status WaitFor(int field, uint64_t round, int first, int last, const std::string& what);
  // Records `status` as the lane's failure, tells the other members, and returns it.
  absl::Status Fail(absl::Status status);
  // Tells sleeping members that a control block or the header changed.
  void WakeWaiters();

  void* mapping_;
  size_t mapping_bytes_;
  int rank_;
  int size_;
  absl::Duration timeout_;
  std::vector<int64_t> pids_;  // by rank, for the liveness check
  bool spins_;                 // whether waits spin before sleeping (a CPU per member)
  uint64_t round_ = 0;
  absl::Status broken_;
};

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_INTERNAL_HOST_LANE_H_
