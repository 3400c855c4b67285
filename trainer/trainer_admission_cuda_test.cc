// gpu: cumulative admission on one GPU with the CUDA probe. A model whose forward keeps
// activations for backward is calibrated (peak and retained bytes per token) from the caching
// allocator's readings; then microbatches that fit one by one but not together are refused all at
// once (ForwardAllMicrobatches keeps every microbatch's outputs and graph until it returns) while
// the stream, releasing each microbatch (its outputs and graph) before the next, runs them with the
// peak under the cap; and under a cap that fits them together, ForwardAllMicrobatches runs with the
// peak under that cap.

#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "admission/cuda_memory_probe.h"
#include "admission/memory_model.h"
#include "base/status_macros.h"
#include "base/status_testutil.h"
#include "c10/cuda/CUDAFunctions.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/trainer_rank.h"

namespace lockstep {
namespace trainer {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kWidth = 1024, kHidden = 4096, kTokens = 2048, kMicrobatches = 4;

struct Mlp {
  at::Tensor w1, w2;
  Mlp() {
    const auto options = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
    w1 = (at::randn({kHidden, kWidth}, options) * 0.02).requires_grad_();
    w2 = (at::randn({kWidth, kHidden}, options) * 0.02).requires_grad_();
  }
  // The graph keeps the hidden activations (and the relu's mask) for backward.
  at::Tensor Forward(const at::Tensor& x) const {
    return at::mm(at::relu(at::mm(x, w1.t())), w2.t());
  }
};

double MiB(double bytes) { return bytes / (1 << 20); }

TEST(TrainerAdmissionCudaTest, WhatStaysHeldUntilTheHandBackIsAdmittedAndThePeakStaysUnderTheCap) {
  ASSERT_TRUE(at::hasCUDA()) << "a gpu test: it needs a CUDA device";
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<admission::CudaMemoryProbe> owned,
                                admission::CudaMemoryProbe::Create(0));
  std::shared_ptr<admission::MemoryProbe> probe = std::move(owned);
  at::manual_seed(3);
  Mlp mlp;
  const auto options = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  const at::Tensor rows = at::randn({kTokens * kMicrobatches, kWidth}, options);
  // Calibration: the model alone at a few token counts; the peak above what was held before and
  // what stays held after (outputs and saved activations).
  std::vector<admission::PeakSample> samples;
  for (int64_t tokens : {256, 512, 1024, 2048, 3072}) {
    LOCKSTEP_ASSERT_OK(probe->ReleaseCachedMemory());
    LOCKSTEP_ASSERT_OK(probe->ResetPeak());
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(admission::MemoryReading before, probe->Read());
    at::Tensor out = mlp.Forward(rows.narrow(0, 0, tokens));
    c10::cuda::device_synchronize();
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(admission::MemoryReading after, probe->Read());
    admission::PeakSample sample = admission::PeakSample::Of(
        admission::WorkShape::Of(tokens), static_cast<double>(after.peak_allocated_bytes));
    sample.retained_bytes = static_cast<double>(after.allocated_bytes - before.allocated_bytes);
    samples.push_back(sample);
    out = at::Tensor();  // drops the graph
  }
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(admission::Calibration fit,
                                admission::MemoryModel::Calibrate(samples, {}));
  const admission::WorkShape one = admission::WorkShape::Of(kTokens);
  const double alone = fit.model.Predict(one), held = fit.model.PredictRetained(one);
  std::printf(
      "calibrated: peak %.1f MiB + %.1f KiB/token (worst error %.2f%%), retained %.1f "
      "KiB/token (worst error %.2f%%)\n",
      MiB(fit.model.fixed_bytes()), fit.model.bytes_per_token() / 1024,
      100 * fit.worst_relative_error, fit.model.retained_bytes_per_token() / 1024,
      100 * fit.worst_retained_relative_error);
  ASSERT_GT(held, 0.1 * alone) << "the model keeps too little for the test to mean anything";

  std::vector<planner::Sequence> batch;
  for (int m = 0; m < kMicrobatches; ++m) batch.push_back(planner::Sequence::Of(kTokens, m));
  auto make_trainer = [&](int64_t cap) -> absl::StatusOr<std::unique_ptr<TrainerRank>> {
    LOCKSTEP_ASSIGN_OR_RETURN(auto streams,
                              rng::RankStreams::Create(rng::DefaultGenerators::WithCudaDevice(0)));
    LOCKSTEP_ASSIGN_OR_RETURN(const collectives::Topology topology,
                              collectives::Topology::CreateExact(1, 1, 1, 1));
    TrainerConfig config = TrainerConfig::Of(kTokens);
    config.plan.packing = planner::PACKING_IN_ORDER;
    config.memory_model = fit.model;
    config.memory_cap_bytes = cap;
    auto collaborators = TrainerRank::Collaborators::Of(topology, 0, nullptr, streams);
    collaborators.memory_probe = probe;
    return TrainerRank::Create(config, collaborators,
                               [&](const ShardWork& work) -> absl::StatusOr<at::Tensor> {
                                 return mlp.Forward(work.inputs);
                               });
  };

  // Fits alone (with a 25% margin over the fit), not together.
  const int64_t small_cap = static_cast<int64_t>(1.25 * alone + 1.5 * held);
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto trainer, make_trainer(small_cap));
    const absl::StatusOr<std::vector<MicrobatchOutput>> all =
        trainer->ForwardAllMicrobatches(TrainerInputs::Of(batch, rows));
    EXPECT_EQ(all.status().code(), absl::StatusCode::kResourceExhausted) << all.status();
    EXPECT_THAT(std::string(all.status().message()),
                HasSubstr("each fits alone but not all together"));
    LOCKSTEP_ASSERT_OK(probe->ReleaseCachedMemory());
    LOCKSTEP_ASSERT_OK(probe->ResetPeak());
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(MicrobatchStream stream,
                                  trainer->ForwardMicrobatches(TrainerInputs::Of(batch, rows)));
    int yielded = 0;
    while (true) {
      LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::optional<MicrobatchOutput> out, stream.Next());
      if (!out) break;
      ++yielded;
      // Dropped at the end of the iteration: its graph goes with it before the next forward. (A
      // backward here would add the caller's own memory — gradients — which admission does not
      // predict.)
    }
    EXPECT_EQ(yielded, kMicrobatches);
    c10::cuda::device_synchronize();
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(admission::MemoryReading reading, probe->Read());
    std::printf("stream: peak %.1f MiB under a cap of %.1f MiB (together predicted %.1f MiB)\n",
                MiB(reading.peak_allocated_bytes), MiB(small_cap), MiB(alone + 3 * held));
    EXPECT_LE(reading.peak_allocated_bytes, small_cap);
  }
  // Fits together.
  const int64_t big_cap = static_cast<int64_t>(1.25 * (alone + (kMicrobatches - 1) * held));
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto trainer, make_trainer(big_cap));
    LOCKSTEP_ASSERT_OK(probe->ReleaseCachedMemory());
    LOCKSTEP_ASSERT_OK(probe->ResetPeak());
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::vector<MicrobatchOutput> all,
                                  trainer->ForwardAllMicrobatches(TrainerInputs::Of(batch, rows)));
    c10::cuda::device_synchronize();
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(admission::MemoryReading reading, probe->Read());
    std::printf("all at once: peak %.1f MiB under a cap of %.1f MiB (the small cap was %.1f)\n",
                MiB(reading.peak_allocated_bytes), MiB(big_cap), MiB(small_cap));
    EXPECT_EQ(all.size(), static_cast<size_t>(kMicrobatches));
    EXPECT_LE(reading.peak_allocated_bytes, big_cap);
    EXPECT_GT(reading.peak_allocated_bytes, small_cap) << "the refusal above was not needed";
  }
}

}  // namespace
}  // namespace trainer
}  // namespace lockstep
