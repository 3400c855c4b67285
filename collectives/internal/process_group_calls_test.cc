#include "collectives/internal/process_group_calls.h"

#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/stopwatch.h"
#include "gtest/gtest.h"
#include "testing/process_world.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"

namespace lockstep {
namespace collectives {
namespace internal {

// A member that checks in for a collective (the in-step exchange) and then sends nothing: alive
// and in step, but its payload never comes.
class ProcessGroupCallsTestPeer {
 public:
  static absl::Status CheckInOnly(ProcessGroupCalls& calls, ProcessGroupCalls::CallKind kind,
                                  const at::Tensor& tensor) {
    ProcessGroupCalls::Call call;
    call.kind = kind;
    if (kind == ProcessGroupCalls::kBroadcast) call.root = 1;  // rank 0 waits to receive
    if (kind != ProcessGroupCalls::kBarrier) {
      call.dtype = static_cast<int64_t>(tensor.scalar_type());
      call.bytes = static_cast<int64_t>(tensor.nbytes());
    }
    return calls.CheckInStep(call, "the stalled peer's check-in");
  }
};

namespace {

// The communicator's bound, and how long the peer stays alive after checking in: long enough
// that a payload wait without the bound would be seen waiting past it.
constexpr absl::Duration kTimeout = absl::Seconds(1);
constexpr absl::Duration kPeerStalls = absl::Seconds(6);

// Runs `kind` on rank 0 of a Gloo group of 2 whose rank 1 checks in and stalls: rank 0's call
// must end with kDeadlineExceeded within the communicator's bound.
void ExpectThePayloadWaitIsBounded(ProcessGroupCalls::CallKind kind) {
  const std::string store =
      absl::StrCat(::testing::TempDir(), "/payload_store_", getpid(), "_", kind);
  ProcessWorldOptions world;
  world.world_size = 2;
  world.collective_timeout = absl::Seconds(20);
  const std::vector<absl::Status> results =
      RunProcessWorld(world, [&](int rank, Communicator&) -> absl::Status {
        LOCKSTEP_RETURN_IF_ERROR(IgnoreSigpipeAtDefault());
        // Gloo's own timeout far past the communicator's: only lockstep's bound can end the wait.
        auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(30));
        options->devices = {c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")};
        auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(
            c10::make_intrusive<c10d::FileStore>(store, 2), rank, 2, options);
        ProcessGroupCalls calls(group, {0, 1}, std::nullopt, kTimeout);
        at::Tensor tensor = at::ones({4});
        if (rank == 1) {
          LOCKSTEP_RETURN_IF_ERROR(ProcessGroupCallsTestPeer::CheckInOnly(calls, kind, tensor));
          std::this_thread::sleep_for(absl::ToChronoMilliseconds(kPeerStalls));
          return absl::OkStatus();
        }
        const Stopwatch took;
        absl::Status status;
        switch (kind) {
          case ProcessGroupCalls::kBroadcast:
            status = calls.Broadcast(tensor, 1, "broadcast from the stalled peer");
            break;
          case ProcessGroupCalls::kAllGather:
            status = calls.AllGather(tensor, "all-gather").status();
            break;
          case ProcessGroupCalls::kAllReduce:
            status = calls.AllReduceSum(tensor, "all-reduce");
            break;
          case ProcessGroupCalls::kBarrier:
            status = calls.Barrier("barrier");
            break;
        }
        // The bound is the timeout plus at most 5 s (here 1 s more), with slack for the machine.
        const absl::Duration limit = 2 * kTimeout + absl::Seconds(2);
        if (status.code() != absl::StatusCode::kDeadlineExceeded || took.Elapsed() > limit) {
          return absl::InternalError(
              absl::StrCat("the payload wait ended after ", absl::FormatDuration(took.Elapsed()),
                           " (limit ", absl::FormatDuration(limit), ") with ", status.ToString()));
        }
        return absl::OkStatus();
      });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].ok()) << "kind " << kind << ", rank " << r << ": " << results[r];
  }
}

TEST(ProcessGroupCallsTest, ABroadcastWhoseRootStallsAfterCheckingInEndsWithinTheTimeout) {
  ExpectThePayloadWaitIsBounded(ProcessGroupCalls::kBroadcast);
}

TEST(ProcessGroupCallsTest, AnAllGatherWhosePeerStallsAfterCheckingInEndsWithinTheTimeout) {
  ExpectThePayloadWaitIsBounded(ProcessGroupCalls::kAllGather);
}

TEST(ProcessGroupCallsTest, AnAllReduceWhosePeerStallsAfterCheckingInEndsWithinTheTimeout) {
  ExpectThePayloadWaitIsBounded(ProcessGroupCalls::kAllReduce);
}

TEST(ProcessGroupCallsTest, ABarrierWhosePeerStallsAfterCheckingInEndsWithinTheTimeout) {
  ExpectThePayloadWaitIsBounded(ProcessGroupCalls::kBarrier);
}

}  // namespace
}  // namespace internal
}  // namespace collectives
}  // namespace lockstep
