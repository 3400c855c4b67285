#include "collectives/outcome.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fake_communicator.h"

namespace lockstep {
namespace collectives {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(AgreeOnOutcomeTest, EveryMemberSucceedingIsOkEverywhere) {
  FakeWorld world(3);
  for (const absl::Status& s : world.Run([](Communicator& comm) -> absl::Status {
         absl::StatusOr<GroupOutcome> outcome = AgreeOnOutcome(&comm, absl::OkStatus());
         if (!outcome.ok()) return outcome.status();
         if (!outcome->ok() || outcome->codes.size() != 3) return absl::InternalError("not ok");
         return outcome->ForMember(absl::OkStatus(), "work");
       })) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

// One member fails: every member learns which one and why; the failing member keeps its own
// status, the others get kAborted naming it; the out-of-memory count is separate.
TEST(AgreeOnOutcomeTest, EveryMemberNamesTheFirstFailingRankAndItsError) {
  FakeWorld world(4);
  std::vector<absl::Status> results = world.Run([](Communicator& comm) -> absl::Status {
    absl::Status local = absl::OkStatus();
    if (comm.rank() == 2) local = absl::InvalidArgumentError("bad shard on rank 2");
    if (comm.rank() == 3) local = absl::ResourceExhaustedError("out of memory on rank 3");
    absl::StatusOr<GroupOutcome> outcome = AgreeOnOutcome(&comm, local);
    if (!outcome.ok()) return outcome.status();
    if (outcome->first_failed != 2 || outcome->first_failed_global != 2 ||
        outcome->out_of_memory() != 1 || outcome->failed() != 1 || outcome->only_out_of_memory() ||
        outcome->first_failure.code() != absl::StatusCode::kInvalidArgument) {
      return absl::InternalError(absl::StrCat("wrong outcome on rank ", comm.rank()));
    }
    return outcome->ForMember(local, "microbatch 0");
  });
  EXPECT_EQ(results[2].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(results[2].message(),
              AllOf(HasSubstr("bad shard on rank 2"), HasSubstr("microbatch 0")));
  EXPECT_EQ(results[3].code(), absl::StatusCode::kResourceExhausted);
  for (int r : {0, 1}) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kAborted) << results[r];
    EXPECT_THAT(std::string(results[r].message()),
                AllOf(HasSubstr("microbatch 0: global rank 2 of the group failed it"),
                      HasSubstr("INVALID_ARGUMENT: bad shard on rank 2")));
  }
}

TEST(AgreeOnOutcomeTest, WithoutAGroupTheMembersOwnOutcome) {
  absl::StatusOr<GroupOutcome> ok = AgreeOnOutcome(nullptr, absl::OkStatus());
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->ok());
  absl::StatusOr<GroupOutcome> oom = AgreeOnOutcome(nullptr, absl::ResourceExhaustedError("x"));
  ASSERT_TRUE(oom.ok());
  EXPECT_TRUE(oom->only_out_of_memory());
  EXPECT_EQ(oom->ForMember(absl::ResourceExhaustedError("x"), "w").code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace collectives
}  // namespace lockstep
