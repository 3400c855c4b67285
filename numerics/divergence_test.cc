// numerics/divergence: a perturbation injected into the k-th module of a 12-module model, in
// forward or in backward, is localized to that module for every k; identical runs do not
// diverge; recordings survive saving and loading.

#include "numerics/divergence.h"

#include <string>

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
  Recorder recorder(RecorderOptions().set_keep_full_tensors(keep));
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
