// numerics/repeatability: a deterministic step with dropout is repeatable bit for bit (the
// harness restores the RNG and clears gradients between passes); a step whose result drifts
// from pass to pass is reported with the tensor that drifts.

#include "numerics/repeatability.h"

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
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
  // The controls, one per duty of the harness, each with the other duty done by hand: the passes
  // differ without the RNG restored (dropout draws anew), and without the gradients cleared
  // (they add up) — so each duty is needed for the result above.
  auto clear = [&] {
    model.w1.mutable_grad().reset();
    model.w2.mutable_grad().reset();
  };
  clear();
  const at::Tensor loss_a = model.Step().detach().clone();
  const at::Tensor grad_a = model.w1.grad().clone();
  clear();  // gradients cleared, the RNG not restored
  const at::Tensor loss_b = model.Step().detach().clone();
  EXPECT_FALSE(at::equal(loss_a, loss_b)) << "dropout drew the same mask without the RNG restored";
  EXPECT_FALSE(at::equal(grad_a, model.w1.grad()));
  const at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  clear();
  const at::Tensor loss_c = model.Step().detach().clone();
  const at::Tensor grad_c = model.w1.grad().clone();
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  generator.set_state(rng);  // the RNG restored, gradients not cleared
  const at::Tensor loss_d = model.Step().detach().clone();
  EXPECT_TRUE(at::equal(loss_c, loss_d)) << "with the RNG restored the loss repeats";
  EXPECT_FALSE(at::equal(grad_c, model.w1.grad())) << "uncleared gradients must add up";
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
