#include "collectives/agreement.h"

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

// With an explainer, every member's error says what differs, worded from every member's
// metadata alike; agreeing members never call it (it costs collectives only on disagreement).
TEST(CheckAgreementTest, AnExplainerSaysWhatDiffersOnEveryMember) {
  collectives::FakeWorld world(3);
  std::vector<absl::Status> results = world.Run([](Communicator& comm) {
    return CheckAgreement(comm, "register_object", comm.rank() == 1 ? "w:[4,3]" : "w:[3,4]",
                          [&comm](const std::vector<std::string>& all) {
                            for (size_t m = 1; m < all.size(); ++m) {
                              if (all[m] != all[0]) {
                                return absl::StrCat("member ", m, " holds ", all[m], " not ",
                                                    all[0], " (", comm.size(), " members)");
                              }
                            }
                            return std::string("no difference");
                          });
  });
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("global rank(s) [1] hold"),
                                   HasSubstr(": member 1 holds w:[4,3] not w:[3,4] (3 members)")));
  }
  for (const absl::Status& s : world.Run([](Communicator& comm) {
         return CheckAgreement(comm, "op", "same", [](const std::vector<std::string>&) {
           ADD_FAILURE() << "explained an agreement";
           return std::string();
         });
       })) {
    EXPECT_TRUE(s.ok()) << s;
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
