// testing/nccl_world.h  (testonly, --config=cuda)
//
// RunNcclWorld runs a body in one forked process per visible GPU, each holding an
// NcclCommunicator on its own device (the world of all GPUs), for tests and benchmarks of NCCL
// across GPUs. The GPU count is read in a child process, so the caller's process starts no CUDA
// context before forking. Worlds need at least two GPUs; with fewer, RunNcclWorld returns the
// reason to skip instead of results.
//
// Example:
//   NcclWorldResult result = RunNcclWorld(options, [](int rank, NcclCommunicator& world) {
//     at::Tensor t = at::full({4}, rank);
//     return world.AllReduceSum(t);
//   });
//   if (!result.skip_reason.empty()) GTEST_SKIP() << result.skip_reason;

#ifndef LOCKSTEP_TESTING_NCCL_WORLD_H_
#define LOCKSTEP_TESTING_NCCL_WORLD_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/nccl_communicator.h"

namespace lockstep {
namespace collectives {

// GPUs visible to a fresh process (counted in a child, so this process initializes no CUDA).
absl::StatusOr<int> CountGpusInChild();

struct NcclWorldOptions {
  // Every collective's timeout. Default: 60 s.
  absl::Duration timeout = absl::Seconds(60);
  // The whole run's limit. Default: 300 s.
  absl::Duration deadline = absl::Seconds(300);
  NcclCommunicator::CpuStaging cpu_staging = NcclCommunicator::CpuStaging::kMappedHost;
  // NcclCommunicator::Options::host_lane. Default: true.
  bool host_lane = true;
};

struct NcclWorldResult {
  // Non-empty when the machine has fewer than two GPUs: nothing ran.
  std::string skip_reason;
  // Each rank's status, indexed by rank (= its GPU).
  std::vector<absl::Status> ranks;
};

NcclWorldResult RunNcclWorld(const NcclWorldOptions& options,
                             std::function<absl::Status(int rank, NcclCommunicator& world)> body);

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_TESTING_NCCL_WORLD_H_
