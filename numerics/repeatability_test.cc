// numerics/repeatability: a deterministic step with dropout is repeatable bit for bit (the
// harness restores the RNG and clears gradients between passes); a step whose result drifts
// from pass to pass is reported with the tensor that drifts.

#include "numerics/repeatability.h"

#include "ATen/ATen.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace lockstep {
namespace numerics {
namespace {

using ::testing::HasSubstr;

struct Model {
  at::Tensor w1 = (at::randn({16, 8}) * 0.3).requires_grad_();
  at::Tensor w2 = (at::randn({1, 16}) * 0.3).requires_grad_();
  at::Tensor batch = at::randn({4, 8});
  NamedTensors parameters() const { return {{"w1", w1}, {"w2", w2}}; }
  // Forward with dropout (draws from the default CPU generator) and backward.
  at::Tensor Step(double drift = 0) {
    at::Tensor h = at::dropout(at::linear(batch, w1).relu(), 0.5, /*train=*/true);
    at::Tensor loss = at::linear(h, w2).pow(2).mean() + drift;
    loss.backward();
    return loss;
  }
};

TEST(RepeatabilityTest, ADeterministicStepWithDropoutIsBitwiseRepeatable) {
  at::manual_seed(1);
  Model model;
  auto step = [&]() -> absl::StatusOr<NamedTensors> {
    return NamedTensors{{"loss", model.Step()}};
  };
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RepeatabilityReport report,
                                RunRepeatability(step, model.parameters(), Tolerance::Bitwise()));
  EXPECT_TRUE(report.repeatable());
  EXPECT_EQ(report.warm1_vs_cold.passed, 3);  // output/loss, grad/w1, grad/w2
  // The control: without the harness, the passes differ (dropout draws anew, gradients add up).
  const at::Tensor first = model.Step().detach().clone();
  const at::Tensor grad = model.w1.grad().clone();
  const at::Tensor second = model.Step().detach().clone();
  EXPECT_FALSE(at::equal(first, second));
  EXPECT_FALSE(at::equal(grad, model.w1.grad()));
}

TEST(RepeatabilityTest, DriftIsReportedWithTheTensorThatDrifts) {
  at::manual_seed(2);
  Model model;
  int pass = 0;
  auto step = [&]() -> absl::StatusOr<NamedTensors> {
    return NamedTensors{{"loss", model.Step(1.0 * pass++)}};
  };
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RepeatabilityReport report,
                                RunRepeatability(step, model.parameters(), Tolerance()));
  EXPECT_FALSE(report.repeatable());
  EXPECT_EQ(report.warm1_vs_cold.failed, 1);
  EXPECT_EQ(report.warm1_vs_cold.WorstByToleranceRatio(1).front(), "output/loss");
  const nlohmann::json j = RepeatabilityJson(report);
  EXPECT_EQ(j["repeatable"], false);
  EXPECT_EQ(j["warm2_vs_warm1"]["failed"], 1);
}

TEST(RepeatabilityTest, AStepErrorNamesThePass) {
  int pass = 0;
  auto step = [&]() -> absl::StatusOr<NamedTensors> {
    if (++pass == 2) return absl::InternalError("out of luck");
    return NamedTensors{};
  };
  const absl::Status s = RunRepeatability(step, {}, Tolerance()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("out of luck; in the warm1 pass"));
}

}  // namespace
}  // namespace numerics
}  // namespace lockstep
