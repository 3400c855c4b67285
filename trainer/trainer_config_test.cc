// TrainerConfig::Canonical: equal configurations give equal text, and changing any field the
// trainer reads changes it (so replicas that compare it see every difference).

#include "trainer/trainer_config.h"

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lockstep {
namespace trainer {
namespace {

TEST(TrainerConfigTest, EqualConfigurationsHaveEqualCanonicalText) {
  EXPECT_EQ(TrainerConfig::Of(64).Canonical(), TrainerConfig::Of(64).Canonical());
  EXPECT_NE(TrainerConfig::Of(64).Canonical().find("plan.max_tokens_per_microbatch=64"),
            std::string::npos);
}

TEST(TrainerConfigTest, EveryFieldTheTrainerReadsChangesTheCanonicalText) {
  const std::vector<std::function<void(TrainerConfig&)>> changes = {
      [](TrainerConfig& c) { c.plan.max_tokens_per_microbatch = 65; },
      [](TrainerConfig& c) { c.plan.packing = planner::PACKING_IN_ORDER; },
      [](TrainerConfig& c) { c.plan.loss_normalization = planner::LOSS_SUM; },
      [](TrainerConfig& c) { c.memory_model = *admission::MemoryModel::Of(1e3, 1e2); },
      [](TrainerConfig& c) { c.memory_cap_bytes = 1 << 20; },
      [](TrainerConfig& c) { c.recovery.max_split_depth = 2; },
      [](TrainerConfig& c) { c.activation_checkpointing = true; },
  };
  std::set<std::string> texts = {TrainerConfig::Of(64).Canonical()};
  for (const auto& change : changes) {
    TrainerConfig config = TrainerConfig::Of(64);
    change(config);
    EXPECT_TRUE(texts.insert(config.Canonical()).second) << config.Canonical();
  }
}

}  // namespace
}  // namespace trainer
}  // namespace lockstep
