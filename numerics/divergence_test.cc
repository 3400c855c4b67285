// numerics/divergence: a perturbation injected into the k-th module of a 12-module model, in
// forward or in backward, is localized to that module for every k; identical runs do not
// diverge; recordings survive saving and loading.

#include "numerics/divergence.h"

#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "numerics/safetensors.h"

namespace lockstep {
namespace numerics {
namespace {

using ::testing::HasSubstr;

constexpr int kModules = 12;

// A 12-module model (tanh(W_i x + b_i)) with taps; `forward_k` adds 1e-4 to module k's output,
// `backward_k` scales the gradient inside module k's backward by 1.001.
Recording RecordRun(int forward_k, int backward_k, int keep = 0) {
  at::manual_seed(0);
  std::vector<at::Tensor> weights, biases;
  for (int i = 0; i < kModules; ++i) {
    weights.push_back((at::randn({16, 16}) * 0.3).requires_grad_());
    biases.push_back(at::randn({16}).requires_grad_());
  }
  // The input requires grad, so that block0's backward shows in a gradient the taps see.
  at::Tensor x = at::randn({4, 16}).requires_grad_();
  RecorderOptions options;
  options.keep_full_tensors = keep;
  Recorder recorder(options);
  for (int i = 0; i < kModules; ++i) {
    const std::string name = absl::StrCat("block", i);
    x = recorder.Enter(name, x);
    at::Tensor h = at::linear(x, weights[i], biases[i]);
    if (i == backward_k) h.register_hook([](const at::Tensor& g) { return g * 1.001; });
    at::Tensor y = h.tanh();
    if (i == forward_k) y = y + 1e-4;
    x = recorder.Exit(name, y);
  }
  x.pow(2).sum().backward();
  EXPECT_TRUE(recorder.status().ok()) << recorder.status();
  return recorder.Snapshot();
}

TEST(DivergenceTest, RecordsFollowExecutionOrder) {
  const Recording r = RecordRun(-1, -1);
  // 12 forward outputs, then per module (last first) the gradient at its output and its input.
  ASSERT_EQ(r.records().size(), 12u + 12 + 12);
  EXPECT_EQ(r.records()[0].module, "block0");
  EXPECT_EQ(r.records()[11].module, "block11");
  EXPECT_EQ(r.records()[12].module, "block11");
  EXPECT_EQ(r.records()[12].kind, RecordKind::kGradientAtOutput);
  EXPECT_EQ(r.records()[13].module, "block11");
  EXPECT_EQ(r.records()[13].kind, RecordKind::kGradientAtInput);
  EXPECT_EQ(r.records()[14].module, "block10");
  EXPECT_EQ(r.records().back().module, "block0");
  EXPECT_EQ(r.records().back().kind, RecordKind::kGradientAtInput);
}

TEST(DivergenceTest, IdenticalRunsDoNotDiverge) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::optional<Divergence> d,
                                FirstDivergence(RecordRun(-1, -1), RecordRun(-1, -1)));
  EXPECT_FALSE(d.has_value());
  EXPECT_EQ(DivergenceJson(d)["diverged"], false);
}

TEST(DivergenceTest, AForwardPerturbationIsFoundInItsModuleForEveryK) {
  const Recording reference = RecordRun(-1, -1);
  for (int k = 0; k < kModules; ++k) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::optional<Divergence> d,
                                  FirstDivergence(reference, RecordRun(k, -1)));
    ASSERT_TRUE(d.has_value()) << k;
    EXPECT_EQ(d->module, absl::StrCat("block", k));
    EXPECT_EQ(d->kind, RecordKind::kForwardOutput) << k;
    EXPECT_EQ(d->reason, "digest");
    EXPECT_EQ(d->index, k);
  }
}

TEST(DivergenceTest, ABackwardPerturbationIsFoundInItsModuleForEveryK) {
  const Recording reference = RecordRun(-1, -1);
  for (int k = 0; k < kModules; ++k) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::optional<Divergence> d,
                                  FirstDivergence(reference, RecordRun(-1, k)));
    ASSERT_TRUE(d.has_value()) << k;
    EXPECT_EQ(d->module, absl::StrCat("block", k)) << k;
    EXPECT_EQ(d->kind, RecordKind::kGradientAtInput) << k;
  }
}

TEST(DivergenceTest, KeptTensorsGiveTheComparisonFiguresAndSurviveSaving) {
  const Recording a = RecordRun(-1, -1, /*keep=*/100);
  const Recording b = RecordRun(5, -1, /*keep=*/100);
  const std::string path_a = testing::TempDir() + "/a.rec";
  const std::string path_b = testing::TempDir() + "/b.rec";
  LOCKSTEP_ASSERT_OK(a.Save(path_a));
  LOCKSTEP_ASSERT_OK(b.Save(path_b));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Recording loaded_a, Recording::Load(path_a));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Recording loaded_b, Recording::Load(path_b));
  ASSERT_EQ(loaded_a.records().size(), a.records().size());
  EXPECT_EQ(loaded_a.records()[3].digest, a.records()[3].digest);
  EXPECT_TRUE(at::equal(loaded_a.records()[3].tensor, a.records()[3].tensor));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::optional<Divergence> d, FirstDivergence(loaded_a, loaded_b));
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->module, "block5");
  ASSERT_TRUE(d->comparison.has_value());
  EXPECT_NEAR(d->comparison->max_abs_diff, 1e-4, 1e-6);
  const nlohmann::json j = DivergenceJson(d);
  EXPECT_EQ(j["module"], "block5");
  EXPECT_EQ(j["kind"], "forward_output");
  EXPECT_TRUE(j.contains("comparison"));
  // A file that is not a recording.
  const std::string plain = testing::TempDir() + "/plain.safetensors";
  LOCKSTEP_ASSERT_OK(WriteSafetensors(plain, {{"x", at::ones({1})}}));
  EXPECT_THAT(Recording::Load(plain).status().message(), HasSubstr("not a lockstep recording"));
}

// Note [Leaf gradients]: three contributions to one parameter w, accumulated in `order`; `bump`
// is added to the second contribution. In float32 (1e8 + 1) - 1e8 is 0 while (1e8 - 1e8) + 1 is
// 1, so the orders (0, 1, 2) and (0, 2, 1) accumulate different gradients from the same
// contributions.
Recording LeafRun(const std::vector<int>& order, float bump) {
  at::Tensor w = at::zeros({1}).requires_grad_();
  Recorder recorder;
  absl::StatusOr<ParameterTap> tap = recorder.TapParameter("w", w);
  EXPECT_TRUE(tap.ok()) << tap.status();
  const float scale[3] = {1e8f, 1.0f + bump, -1e8f};
  for (int k : order) (w * scale[k]).sum().backward();
  EXPECT_TRUE(recorder.RecordAccumulated("w", w).ok());
  return recorder.Snapshot();
}

TEST(DivergenceTest, ALeafGradientTellsAChangedContributionFromAChangedAccumulationOrder) {
  const Recording in_order = LeafRun({0, 1, 2}, 0);
  const Recording reordered = LeafRun({0, 2, 1}, 0);
  const Recording bumped = LeafRun({0, 2, 1}, 0.5f);
  ASSERT_EQ(in_order.records().size(), 4u);  // three contributions, then the .grad
  EXPECT_EQ(in_order.records()[0].kind, RecordKind::kIncomingGradient);
  EXPECT_EQ(in_order.records()[3].kind, RecordKind::kAccumulatedGradient);

  LOCKSTEP_ASSERT_OK_AND_ASSIGN(GradientLocalization same,
                                LocalizeParameterGradient(in_order, LeafRun({0, 1, 2}, 0), "w"));
  EXPECT_EQ(same.verdict, GradientLocalization::kSame);

  LOCKSTEP_ASSERT_OK_AND_ASSIGN(GradientLocalization order,
                                LocalizeParameterGradient(in_order, reordered, "w"));
  EXPECT_EQ(order.verdict, GradientLocalization::kAccumulation);
  EXPECT_EQ(order.incoming_a, 3);
  EXPECT_EQ(order.incoming_b, 3);
  // Record by record, the runs first differ at the second contribution: without the set
  // comparison that would look like a changed contribution.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::optional<Divergence> first,
                                FirstDivergence(in_order, reordered));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->index, 1);

  LOCKSTEP_ASSERT_OK_AND_ASSIGN(GradientLocalization changed,
                                LocalizeParameterGradient(reordered, bumped, "w"));
  EXPECT_EQ(changed.verdict, GradientLocalization::kIncoming);
  EXPECT_EQ(changed.first_unmatched_a, 2);  // the third to arrive: the unbumped 1
  EXPECT_EQ(changed.first_unmatched_b, 2);
  EXPECT_EQ(GradientLocalizationJson(changed)["verdict"], "incoming");

  // The kinds survive saving; a recording without the parameter's .grad is refused.
  const std::string path = absl::StrCat(::testing::TempDir(), "/leaf.rec");
  LOCKSTEP_ASSERT_OK(reordered.Save(path));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Recording loaded, Recording::Load(path));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(GradientLocalization again,
                                LocalizeParameterGradient(in_order, loaded, "w"));
  EXPECT_EQ(again.verdict, GradientLocalization::kAccumulation);
  EXPECT_EQ(LocalizeParameterGradient(in_order, loaded, "v").status().code(),
            absl::StatusCode::kNotFound);
  // Without the contributions nothing tells where a difference entered.
  auto accumulated_only = [](const Recording& r) {
    std::vector<Record> kept;
    for (const Record& record : r.records()) {
      if (record.kind == RecordKind::kAccumulatedGradient) kept.push_back(record);
    }
    kept.back().index = 0;
    return Recording(kept);
  };
  EXPECT_EQ(LocalizeParameterGradient(accumulated_only(in_order), accumulated_only(reordered), "w")
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(DivergenceTest, AParameterTapRecordsOnlyWhileItLivesAndRefusesNonLeaves) {
  at::Tensor w = at::ones({2}).requires_grad_();
  Recorder recorder;
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ParameterTap tap, recorder.TapParameter("w", w));
    ParameterTap moved = std::move(tap);  // the hook goes with the tap
    (w * 2).sum().backward();
  }
  (w * 3).sum().backward();  // the tap is gone: not recorded
  EXPECT_EQ(recorder.Snapshot().records().size(), 1u);
  EXPECT_EQ(recorder.TapParameter("w2", w * 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(recorder.RecordAccumulated("u", at::ones({1}).requires_grad_()).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(DivergenceTest, AShorterRunDivergesAtItsEnd) {
  const Recording full = RecordRun(-1, -1);
  std::vector<Record> fewer(full.records().begin(), full.records().end() - 1);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::optional<Divergence> d,
                                FirstDivergence(full, Recording(fewer)));
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->reason, "length");
  EXPECT_EQ(d->index, static_cast<int64_t>(fewer.size()));
}

}  // namespace
}  // namespace numerics
}  // namespace lockstep
