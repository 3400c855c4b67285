#include "collectives/adopted_communicator.h"

#include <unistd.h>

#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "base/status_testutil.h"
#include "collectives/internal/host_lane.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/process_world.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"

namespace lockstep {
namespace collectives {
namespace {

using ::testing::HasSubstr;

absl::Status Expect(bool condition, const std::string& what) {
  return condition ? absl::OkStatus() : absl::InternalError(what);
}

void ExpectAllOk(const std::vector<absl::Status>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  }
}

ProcessWorldOptions World(int n) {
  ProcessWorldOptions options;
  options.world_size = n;
  options.collective_timeout = absl::Seconds(20);
  return options;
}

// A Gloo group the program made itself, as torch.distributed makes one.
c10::intrusive_ptr<c10d::ProcessGroupGloo> MakeGlooGroup(const std::string& path, int rank,
                                                         int size) {
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(20));
  options->devices = {c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")};
  auto store = c10::make_intrusive<c10d::FileStore>(path, size);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

AdoptedCommunicator::Options Members(std::vector<int> global_ranks, int world_size) {
  AdoptedCommunicator::Options options;
  options.global_ranks = std::move(global_ranks);
  options.world_size = world_size;
  options.timeout = absl::Seconds(20);
  return options;
}

TEST(AdoptedCommunicatorTest, RunsTheCollectivesOnTheGroupAndMakesNoSubGroups) {
  const std::string store = absl::StrCat(::testing::TempDir(), "/adopt_store_", getpid());
  ExpectAllOk(RunProcessWorld(World(2), [&](int rank, Communicator&) -> absl::Status {
    // Global ranks {5, 3} of a world of 6: the adopted group names them, not 0 and 1.
    LOCKSTEP_ASSIGN_OR_RETURN(auto adopted, AdoptedCommunicator::Adopt(
                                                MakeGlooGroup(store, rank, 2), Members({5, 3}, 6)));
    LOCKSTEP_RETURN_IF_ERROR(Expect(!adopted->has_host_lane(), "no store, no lane"));
    LOCKSTEP_RETURN_IF_ERROR(Expect(adopted->rank() == rank && adopted->size() == 2, "rank"));
    LOCKSTEP_ASSIGN_OR_RETURN(const int leader, adopted->GlobalRank(0));
    LOCKSTEP_RETURN_IF_ERROR(Expect(leader == 5, "the leader is global rank 5"));
    at::Tensor t = at::full({3}, 10.0 + rank, at::kFloat);
    LOCKSTEP_RETURN_IF_ERROR(adopted->Broadcast(t, 0));
    LOCKSTEP_RETURN_IF_ERROR(Expect(at::equal(t, at::full({3}, 10.0, at::kFloat)), "broadcast"));
    LOCKSTEP_ASSIGN_OR_RETURN(auto all, adopted->AllGather(at::full({1}, 1.0 * rank, at::kDouble)));
    LOCKSTEP_RETURN_IF_ERROR(Expect(all.size() == 2 && all[1].item<double>() == 1.0, "gather"));
    at::Tensor sum = at::full({2}, 1.0 + rank, at::kFloat);
    LOCKSTEP_RETURN_IF_ERROR(adopted->AllReduceSum(sum));
    LOCKSTEP_RETURN_IF_ERROR(Expect(at::equal(sum, at::full({2}, 3.0, at::kFloat)), "sum"));
    LOCKSTEP_RETURN_IF_ERROR(adopted->Barrier());
    const absl::Status sub = adopted->NewGroup({5, 3}).status();
    LOCKSTEP_RETURN_IF_ERROR(Expect(sub.code() == absl::StatusCode::kFailedPrecondition &&
                                        absl::StrContains(sub.message(), "new_group"),
                                    "NewGroup refused: " + sub.ToString()));
    // Out of step through the group: Gloo's in-step exchange names both calls.
    const absl::Status mismatch = adopted->AllGather(at::zeros({1 + rank}, at::kFloat)).status();
    return Expect(absl::IsFailedPrecondition(mismatch) &&
                      absl::StrContains(mismatch.message(), "out of step"),
                  "the in-step check: " + mismatch.ToString());
  }));
}

// With a store, small CPU tensors take the host lane (shared memory): the results are the same,
// large tensors still go through the group, and members that call different collectives get the
// lane's own error (which names "different collectives", where the group's in-step check says
// "out of step"), so the lane is what ran.
TEST(AdoptedCommunicatorTest, WithAStoreMovesSmallCpuTensorsThroughTheHostLane) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/adopt_lane_", getpid());
  ExpectAllOk(RunProcessWorld(World(2), [&](int rank, Communicator&) -> absl::Status {
    AdoptedCommunicator::Options options = Members({0, 1}, 2);
    options.store = c10::make_intrusive<c10d::FileStore>(path + "_lane", 2);
    options.lane_key = "group/0";
    LOCKSTEP_ASSIGN_OR_RETURN(auto adopted,
                              AdoptedCommunicator::Adopt(MakeGlooGroup(path, rank, 2), options));
    LOCKSTEP_RETURN_IF_ERROR(Expect(adopted->has_host_lane(), "the members share a host"));
    at::Tensor t = at::full({3}, 10.0 + rank, at::kFloat);
    LOCKSTEP_RETURN_IF_ERROR(adopted->Broadcast(t, 1));
    LOCKSTEP_RETURN_IF_ERROR(Expect(at::equal(t, at::full({3}, 11.0, at::kFloat)), "broadcast"));
    at::Tensor sum = at::full({4}, 1.0 + rank, at::kDouble);
    LOCKSTEP_RETURN_IF_ERROR(adopted->AllReduceSum(sum));
    LOCKSTEP_RETURN_IF_ERROR(Expect(at::equal(sum, at::full({4}, 3.0, at::kDouble)), "sum"));
    LOCKSTEP_ASSIGN_OR_RETURN(auto all, adopted->AllGather(at::full({2}, rank, at::kLong)));
    LOCKSTEP_RETURN_IF_ERROR(
        Expect(all.size() == 2 && all[1].sum().item<int64_t>() == 2, "all-gather"));
    // Past the lane's limit: through the group.
    at::Tensor large = at::full({internal::HostLane::kMaxBytes / 4 + 1}, 1.0 + rank, at::kFloat);
    LOCKSTEP_RETURN_IF_ERROR(adopted->AllReduceSum(large));
    LOCKSTEP_RETURN_IF_ERROR(Expect(at::equal(large, at::full_like(large, 3.0)), "large sum"));
    const absl::Status out_of_step = adopted->AllGather(at::zeros({3 + rank}, at::kFloat)).status();
    return Expect(!out_of_step.ok() &&
                      (absl::StrContains(out_of_step.message(), "called different collectives") ||
                       absl::StrContains(out_of_step.message(), "gave up")),
                  "the lane's check: " + out_of_step.ToString());
  }));
}

// The lane builds the all-reduce on its all-gather; their tags (operation and dtype) keep an
// all-reduce on one member and an all-gather on the other from both "succeeding".
TEST(AdoptedCommunicatorTest, AnAllReduceAgainstAnAllGatherIsRefusedOnTheLane) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/adopt_tags_", getpid());
  const std::vector<absl::Status> results =
      RunProcessWorld(World(2), [&](int rank, Communicator&) -> absl::Status {
        AdoptedCommunicator::Options options = Members({0, 1}, 2);
        options.store = c10::make_intrusive<c10d::FileStore>(path + "_lane", 2);
        options.lane_key = "tags/0";
        LOCKSTEP_ASSIGN_OR_RETURN(
            auto adopted, AdoptedCommunicator::Adopt(MakeGlooGroup(path, rank, 2), options));
        at::Tensor t = at::ones({4}, at::kFloat);
        if (rank == 0) return adopted->AllReduceSum(t);
        return adopted->AllGather(t).status();
      });
  ASSERT_EQ(results.size(), 2u);
  for (const absl::Status& s : results) {
    EXPECT_TRUE(absl::IsFailedPrecondition(s) || absl::IsUnavailable(s)) << s;
  }
}

TEST(AdoptedCommunicatorTest, RefusesANullGroupAndOptionsThatDoNotFit) {
  const auto refused = [](const absl::Status& status, const std::string& words) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(words));
  };
  refused(AdoptedCommunicator::Adopt(c10::intrusive_ptr<c10d::ProcessGroupGloo>(), Members({0}, 1))
              .status(),
          "null");
  const std::string store = absl::StrCat(::testing::TempDir(), "/adopt_alone_", getpid());
  auto group = MakeGlooGroup(store, 0, 1);
  refused(AdoptedCommunicator::Adopt(group, Members({0, 1}, 2)).status(),
          "the list has 2 ranks, the group 1");
  refused(AdoptedCommunicator::Adopt(group, Members({4}, 4)).status(), "4");
  AdoptedCommunicator::Options no_time = Members({0}, 1);
  no_time.timeout = absl::ZeroDuration();
  refused(AdoptedCommunicator::Adopt(group, no_time).status(), "timeout");
  AdoptedCommunicator::Options cpu_staging = Members({0}, 1);
  cpu_staging.staging_device = c10::Device(c10::kCPU);
  refused(AdoptedCommunicator::Adopt(group, cpu_staging).status(), "not a CUDA device");
  AdoptedCommunicator::Options keyless = Members({0}, 1);
  keyless.store = c10::make_intrusive<c10d::FileStore>(store + "_lane", 1);
  refused(AdoptedCommunicator::Adopt(group, keyless).status(), "key is empty");
  LOCKSTEP_EXPECT_OK(AdoptedCommunicator::Adopt(group, Members({0}, 1)).status());
}

// A member that never comes to the lane's setup: the others' Adopt fails within the timeout,
// naming the key, instead of waiting forever.
TEST(AdoptedCommunicatorTest, AMemberThatNeverAdoptsIsADeadlineNotAHang) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/adopt_absent_", getpid());
  const std::vector<absl::Status> results =
      RunProcessWorld(World(2), [&](int rank, Communicator&) -> absl::Status {
        auto group = MakeGlooGroup(path, rank, 2);
        if (rank == 1) {
          // Made the group, never adopts it, and keeps it past rank 0's timeout: a group
          // destroyed at once could close its Gloo pairs while rank 0's are still connecting.
          absl::SleepFor(absl::Seconds(3));
          return absl::OkStatus();
        }
        AdoptedCommunicator::Options options = Members({0, 1}, 2);
        options.timeout = absl::Seconds(1);
        options.store = c10::make_intrusive<c10d::FileStore>(path + "_lane", 2);
        options.lane_key = "absent/0";
        return AdoptedCommunicator::Adopt(group, options).status();
      });
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].code(), absl::StatusCode::kDeadlineExceeded) << results[0];
  EXPECT_THAT(std::string(results[0].message()), HasSubstr("absent/0"));
}

}  // namespace
}  // namespace collectives
}  // namespace lockstep
