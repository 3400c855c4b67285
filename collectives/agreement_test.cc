#include "collectives/agreement.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fake_communicator.h"

namespace lockstep {
namespace collectives {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(AgreementDigestTest, IsSha256OfTheFramedParts) {
  // Framing: 8-byte little-endian length before each part.
  // sha256(08 00.. 'register' 01 00.. 'x'), computed independently with Python's hashlib.
  EXPECT_EQ(DigestHex(AgreementDigest("register", "x"), 32),
            "d5754d2df11a9a2ad4088a3a77ca42268fc5a7e41dec6893f2a1b1eab6f5e1b9");
}

TEST(AgreementDigestTest, FramingSeparatesOperationFromMetadata) {
  EXPECT_NE(AgreementDigest("ab", "c"), AgreementDigest("a", "bc"));
  EXPECT_NE(AgreementDigest("op", "meta"), AgreementDigest("opm", "eta"));
}

TEST(CheckAgreementTest, AgreeingRanksPass) {
  collectives::FakeWorld world(4);
  for (const absl::Status& s : world.Run(
           [](Communicator& comm) { return CheckAgreement(comm, "register_object", "head/v1"); })) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(CheckAgreementTest, DisagreementNamesTheRanksOnEveryMember) {
  collectives::FakeWorld world(4);
  std::vector<absl::Status> results = world.Run([](Communicator& comm) {
    // Rank 2 is about to register a different object.
    return CheckAgreement(comm, "register_object", comm.rank() == 2 ? "head/v2" : "head/v1");
  });
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(),
                AllOf(HasSubstr("disagree before 'register_object'"),
                      HasSubstr("global rank(s) [0, 1, 3] hold " +
                                DigestHex(AgreementDigest("register_object", "head/v1"), 4)),
                      HasSubstr("global rank(s) [2] hold " +
                                DigestHex(AgreementDigest("register_object", "head/v2"), 4))));
  }
}

TEST(CheckAgreementTest, DifferentOperationsAreNamed) {
  collectives::FakeWorld world(2);
  std::vector<absl::Status> results = world.Run([](Communicator& comm) {
    return CheckAgreement(comm, comm.rank() == 0 ? "empty_wave" : "run_wave", "step 3");
  });
  for (const absl::Status& s : results) {
    EXPECT_THAT(s.message(), AllOf(HasSubstr("('empty_wave')"), HasSubstr("('run_wave')")));
  }
}

TEST(CheckAgreementTest, DeadPeerIsReportedWithContext) {
  collectives::FakeWorld world(2, {absl::Seconds(5)});
  world.InjectFailure(1, 0);
  std::vector<absl::Status> results =
      world.Run([](Communicator& comm) { return CheckAgreement(comm, "plan", "digest"); });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(results[0].message(), HasSubstr("while checking that"));
}

}  // namespace
}  // namespace collectives
}  // namespace lockstep
