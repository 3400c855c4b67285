// CheckPlanAgreement, and determinism of plan bytes across processes: on a FakeWorld (threads)
// and on real forked processes joined by Gloo (testing/process_world.h), every rank builds the
// plan from the same seeded input and the group's digests must agree and equal the digest this
// test process computed; negative controls perturb one rank's input and expect every rank to
// get kFailedPrecondition naming the odd rank.

#include "planner/plan_agreement.h"

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "base/status_testutil.h"
#include "base/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "planner/planner_testutil.h"
#include "testing/fake_communicator.h"
#include "testing/process_world.h"

namespace lockstep {
namespace planner {
namespace {

using ::testing::HasSubstr;

const PlanOptions kOptions = DeterminismOptions();

std::vector<Sequence> Batch(uint64_t seed) { return DeterminismBatch(seed); }

// Plans the seeded batch (perturbed on `odd_rank`: one sequence a token shorter).
absl::StatusOr<Plan> RankPlan(int rank, int odd_rank) {
  std::vector<Sequence> batch = Batch(42);
  if (rank == odd_rank) {
    batch[17].num_tokens -= 1;
    batch[17].loss_weights.clear();
  }
  return PlanMicrobatches(batch, kOptions);
}

TEST(PlanAgreementTest, SameBytesAcrossRunsInOneProcess) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Plan first_plan, RankPlan(0, -1));
  const std::string first = SerializePlan(first_plan);
  for (int run = 0; run < 3; ++run) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Plan again, RankPlan(0, -1));
    EXPECT_EQ(SerializePlan(again), first);
  }
}

// Freshly exec'd processes (their own heap layout and address randomisation, unlike forked
// ones) make the same plan bytes as this process.
TEST(PlanAgreementTest, SameDigestInFreshlyExecdProcesses) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Plan plan, RankPlan(0, -1));
  const std::string expected = DigestHex(PlanDigest(plan));
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  ASSERT_NE(srcdir, nullptr);
  const std::string tool = absl::StrCat(srcdir, "/", workspace != nullptr ? workspace : "lockstep",
                                        "/planner/plan_digest_main");
  for (int run = 0; run < 2; ++run) {
    absl::StatusOr<Child> child = Child::Exec(ChildOptions::Output(), {tool, "42"}, {});
    ASSERT_TRUE(child.ok()) << child.status();
    std::string output;
    Child* pointer = &*child;
    while (PollChannels({pointer}, absl::Seconds(60), [&](size_t, absl::string_view bytes) {
             output.append(bytes.data(), bytes.size());
           }).value_or(0) > 0) {
    }
    child->Reap();
    ASSERT_TRUE(child->succeeded()) << child->Describe() << ": " << output;
    EXPECT_EQ(output, expected + "\n") << "exec'd run " << run;
  }
}

TEST(PlanAgreementTest, FakeWorldAgreesAndNamesTheOddRank) {
  for (int odd_rank : {-1, 2}) {
    collectives::FakeWorld world(4);
    std::vector<absl::Status> results = world.Run([&](collectives::Communicator& comm) {
      absl::StatusOr<Plan> plan = RankPlan(comm.rank(), odd_rank);
      if (!plan.ok()) return plan.status();
      return CheckPlanAgreement(comm, *plan);
    });
    for (int r = 0; r < 4; ++r) {
      if (odd_rank < 0) {
        EXPECT_TRUE(results[r].ok()) << results[r];
      } else {
        EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << results[r];
        EXPECT_THAT(results[r].message(), HasSubstr("global rank(s) [0, 1, 3] hold"));
        EXPECT_THAT(results[r].message(), HasSubstr("global rank(s) [2] hold"));
        EXPECT_THAT(results[r].message(), HasSubstr(kPlanAgreementOperation));
      }
    }
  }
}

TEST(PlanAgreementTest, OneDifferentPerTokenWeightIsNamed) {
  // Rank 1 holds the same batch except that one token's weight moved to another token of the
  // same sequence: same lengths, ids and weight totals, so the same packing and loss scales.
  const std::vector<Sequence> batch = Batch(42);
  size_t weighted = 0;
  while (weighted < batch.size() &&
         (batch[weighted].loss_weights.size() < 2 ||
          batch[weighted].loss_weights[0] == batch[weighted].loss_weights[1])) {
    ++weighted;
  }
  ASSERT_LT(weighted, batch.size());
  collectives::FakeWorld world(4);
  std::vector<absl::Status> results = world.Run([&](collectives::Communicator& comm) {
    std::vector<Sequence> mine = batch;
    if (comm.rank() == 1) {
      std::swap(mine[weighted].loss_weights[0], mine[weighted].loss_weights[1]);
    }
    absl::StatusOr<Plan> plan = PlanMicrobatches(mine, kOptions);
    if (!plan.ok()) return plan.status();
    return CheckPlanAgreement(comm, *plan);
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << results[r];
    EXPECT_THAT(results[r].message(), HasSubstr("global rank(s) [0, 2, 3] hold"));
    EXPECT_THAT(results[r].message(), HasSubstr("global rank(s) [1] hold"));
  }
}

TEST(PlanAgreementTest, ForkedProcessesBuildIdenticalPlanBytes) {
  // The digest this process computes; every forked rank must compute the same.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Plan parent_plan, RankPlan(0, -1));
  const std::string expected = DigestHex(PlanDigest(parent_plan));
  std::vector<absl::Status> results = collectives::RunProcessWorld(
      collectives::ProcessWorldOptions::Of(4), [&](int rank, collectives::Communicator& world) {
        absl::StatusOr<Plan> plan = RankPlan(rank, -1);
        if (!plan.ok()) return plan.status();
        const std::string digest = DigestHex(PlanDigest(*plan));
        if (digest != expected) {
          return absl::InternalError(
              absl::StrCat("rank ", rank, " digest ", digest, ", parent ", expected));
        }
        return CheckPlanAgreement(world, *plan);
      });
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

TEST(PlanAgreementTest, ForkedProcessWithPerturbedInputIsNamed) {
  std::vector<absl::Status> results = collectives::RunProcessWorld(
      collectives::ProcessWorldOptions::Of(4), [](int rank, collectives::Communicator& world) {
        absl::StatusOr<Plan> plan = RankPlan(rank, /*odd_rank=*/1);
        if (!plan.ok()) return plan.status();
        return CheckPlanAgreement(world, *plan);
      });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << results[r];
    EXPECT_THAT(results[r].message(), HasSubstr("global rank(s) [0, 2, 3] hold"));
    EXPECT_THAT(results[r].message(), HasSubstr("global rank(s) [1] hold"));
  }
}

}  // namespace
}  // namespace planner
}  // namespace lockstep
