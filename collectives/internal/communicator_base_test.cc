// collectives/internal/communicator_base: the shared contract — a communicator is unusable after
// its first error (for the fake here; Gloo and NCCL in their own tests), group creation goes
// through one registry, and a transport failure after the timeout is a deadline.

#include "collectives/internal/communicator_base.h"

#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fake_communicator.h"

namespace lockstep {
namespace collectives {
namespace internal {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A backend whose collectives fail as told, to test the skeleton alone.
class ScriptedCommunicator : public CommunicatorBase {
 public:
  ScriptedCommunicator(std::shared_ptr<WorldState> world, GroupIdentity identity)
      : CommunicatorBase(std::move(world), std::move(identity)) {}

  // The next Barrier sleeps `delay`, then returns `result`.
  void Script(absl::Duration delay, absl::Status result) {
    delay_ = delay;
    result_ = std::move(result);
  }
  int groups_created() const { return groups_created_; }

  absl::Status Broadcast(at::Tensor&, int) override { return absl::OkStatus(); }
  absl::StatusOr<std::vector<at::Tensor>> AllGather(const at::Tensor&) override {
    return std::vector<at::Tensor>();
  }
  absl::Status AllReduceSum(at::Tensor&) override { return absl::OkStatus(); }
  absl::Status Barrier() override {
    return Collective("barrier", [&] {
      absl::SleepFor(delay_);
      return result_;
    });
  }

 private:
  absl::StatusOr<std::unique_ptr<Communicator>> CreateGroup(GroupIdentity identity) override {
    ++groups_created_;
    return std::unique_ptr<Communicator>(
        new ScriptedCommunicator(world_state(), std::move(identity)));
  }

  absl::Duration delay_;
  absl::Status result_;
  int groups_created_ = 0;
};

std::unique_ptr<ScriptedCommunicator> Scripted(int world_size, int rank, absl::Duration timeout) {
  auto world = std::make_shared<WorldState>("scripted", world_size, timeout);
  GroupIdentity identity = GroupIdentity::World(*world, rank);
  return std::make_unique<ScriptedCommunicator>(world, std::move(identity));
}

TEST(CommunicatorBaseTest, IdentityOfTheWorldAndOfGroups) {
  auto comm = Scripted(4, 2, absl::Seconds(5));
  EXPECT_EQ(comm->rank(), 2);
  EXPECT_EQ(comm->size(), 4);
  EXPECT_EQ(comm->global_ranks(), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(comm->DebugName(), "scripted world [0, 1, 2, 3]");
  EXPECT_EQ(comm->timeout(), absl::Seconds(5));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto group, comm->NewGroup({3, 2}));
  EXPECT_EQ(group->rank(), 1);
  EXPECT_EQ(group->DebugName(), "scripted group [3, 2]");
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto again, comm->NewGroup({3, 2}));
  EXPECT_EQ(again->DebugName(), "scripted group [3, 2] #1");  // numbered, so members meet
  EXPECT_EQ(comm->groups_created(), 2);
  EXPECT_EQ(comm->NewGroup({0, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->groups_created(), 2) << "an invalid list must not reach the backend";
}

TEST(CommunicatorBaseTest, AnErrorMakesTheCommunicatorUnusable) {
  auto comm = Scripted(2, 0, absl::Seconds(5));
  comm->Script(absl::ZeroDuration(), absl::OkStatus());
  LOCKSTEP_EXPECT_OK(comm->Barrier());
  comm->Script(absl::ZeroDuration(), absl::UnavailableError("peer 1 hung up"));
  EXPECT_EQ(comm->Barrier().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(comm->failed());
  comm->Script(absl::ZeroDuration(), absl::OkStatus());  // the backend would succeed now
  const absl::Status after = comm->Barrier();
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(after.message(),
              AllOf(HasSubstr("barrier on scripted world [0, 1]"),
                    HasSubstr("unusable after an earlier error"), HasSubstr("peer 1 hung up")));
  EXPECT_EQ(comm->NewGroup({0}).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CommunicatorBaseTest, TransportFailureAfterTheTimeoutIsADeadline) {
  auto late = Scripted(2, 0, absl::Milliseconds(50));
  late->Script(absl::Milliseconds(80), absl::UnavailableError("read: connection closed"));
  const absl::Status status = late->Barrier();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("connection closed"), HasSubstr("50ms")));
  // Before the timeout the same failure is a peer that is gone.
  auto early = Scripted(2, 0, absl::Seconds(30));
  early->Script(absl::ZeroDuration(), absl::UnavailableError("read: connection closed"));
  EXPECT_EQ(early->Barrier().code(), absl::StatusCode::kUnavailable);
}

TEST(CommunicatorBaseTest, CreateRejectsNonPositiveTimeouts) {
  EXPECT_EQ(ValidateTimeout(absl::ZeroDuration()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ValidateTimeout(absl::Seconds(-1)).message(), HasSubstr("-1s must be positive"));
  LOCKSTEP_EXPECT_OK(ValidateTimeout(absl::Seconds(1)));
}

// The in-process fake obeys the same contract.
TEST(FakeCommunicatorContractTest, UnusableAfterAnError) {
  FakeWorld world(2, {absl::Seconds(5)});
  std::vector<absl::Status> results = world.Run([](Communicator& comm) -> absl::Status {
    at::Tensor t = at::zeros({comm.rank() == 0 ? 2 : 3});  // mismatched shapes
    if (comm.AllReduceSum(t).code() != absl::StatusCode::kFailedPrecondition) {
      return absl::InternalError("the mismatch was not reported");
    }
    return comm.Barrier();
  });
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), AllOf(HasSubstr("barrier on fake world"),
                                   HasSubstr("unusable after an earlier error")));
  }
}

}  // namespace
}  // namespace internal
}  // namespace collectives
}  // namespace lockstep
