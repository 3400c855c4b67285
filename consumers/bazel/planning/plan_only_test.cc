// A consumer that only plans links lockstep's planner core, and nothing of LibTorch: the plan of
// a step and its digest, which every rank of a DP group computes alike.

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "planner/planner.h"

namespace {

namespace planner = lockstep::planner;

std::vector<planner::Sequence> Batch(const std::vector<int64_t>& lengths) {
  std::vector<planner::Sequence> batch;
  for (size_t i = 0; i < lengths.size(); ++i) {
    batch.push_back(planner::Sequence::Of(lengths[i], static_cast<int64_t>(i)));
  }
  return batch;
}

TEST(PlanOnlyTest, PlansAndDigestsWithoutLibTorch) {
  const auto plan = planner::PlanMicrobatches(Batch({700, 324, 700, 324}),
                                              planner::PlanOptions::Of(1024, /*cp_size=*/2));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->microbatches_size(), 2);
  EXPECT_EQ(plan->num_tokens(), 2048);
  // The same batch plans to the same digest; another batch to another.
  const auto again =
      planner::PlanMicrobatches(Batch({700, 324, 700, 324}), planner::PlanOptions::Of(1024, 2));
  const auto other =
      planner::PlanMicrobatches(Batch({700, 324, 700, 323}), planner::PlanOptions::Of(1024, 2));
  ASSERT_TRUE(again.ok() && other.ok());
  EXPECT_EQ(planner::PlanDigest(*plan), planner::PlanDigest(*again));
  EXPECT_NE(planner::PlanDigest(*plan), planner::PlanDigest(*other));
}

}  // namespace
