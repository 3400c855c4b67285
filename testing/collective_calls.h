// testing/collective_calls.h  (testonly)
//
// Every collective of collectives::Communicator by name — broadcast, all-gather, all-reduce,
// barrier, bytes and object broadcast — so that a test can run the same fault against each (a
// late peer, a dead one) on every implementation.
//
// Example:
//   for (CollectiveCall call : AllCollectiveCalls()) {
//     absl::Status s = RunCollectiveCall(call, world, at::kCPU);
//   }

#ifndef LOCKSTEP_TESTING_COLLECTIVE_CALLS_H_
#define LOCKSTEP_TESTING_COLLECTIVE_CALLS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "c10/core/Device.h"
#include "collectives/communicator.h"

namespace lockstep {
namespace collectives {

enum class CollectiveCall { kBroadcast, kAllGather, kAllReduce, kBarrier, kBytes, kObject };

std::vector<CollectiveCall> AllCollectiveCalls();

// "broadcast", "all-gather", ... as the communicators name them in their errors.
std::string CollectiveCallName(CollectiveCall call);

// Runs `call` on `comm` with a small tensor on `device` (a rank-dependent value, root 0).
absl::Status RunCollectiveCall(CollectiveCall call, Communicator& comm, c10::Device device);

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_TESTING_COLLECTIVE_CALLS_H_
