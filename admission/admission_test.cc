#include "admission/admission.h"

#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "admission/memory_model.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "testing/fake_memory_probe.h"

namespace lockstep {
namespace admission {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<planner::Plan> PlanOf(const std::vector<int64_t>& lengths, int64_t budget,
                                     int cp_size = 1) {
  std::vector<planner::Sequence> batch;
  for (size_t i = 0; i < lengths.size(); ++i) {
    batch.push_back(planner::Sequence::Of(lengths[i], static_cast<int64_t>(100 + i)));
  }
  planner::PlanOptions options;
  options.max_tokens_per_microbatch = budget;
  options.cp_size = cp_size;
  options.packing = planner::PACKING_IN_ORDER;
  return planner::PlanMicrobatches(batch, options);
}

TEST(MemoryModelTest, PredictsTheTermsAndShapesAreTheBusiestCpRank) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(MemoryModel model, MemoryModel::Of(1000, 10, 0.5));
  EXPECT_DOUBLE_EQ(model.Predict(WorkShape::Of(100, 400)), 1000 + 1000 + 200);
  // One sequence of 8 tokens over CP 2: chunks of 2, each rank owns 4 tokens of a sequence of 8.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const planner::Plan plan, PlanOf({8}, 8, 2));
  const WorkShape shape = ShapeOfMicrobatch(plan, 0);
  EXPECT_EQ(shape.tokens, 4);
  EXPECT_DOUBLE_EQ(shape.attention_pairs, 4 * 8);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const planner::Plan two, PlanOf({5, 3}, 8));
  const WorkShape alone = ShapeOfMicrobatch(two, 0);
  EXPECT_EQ(alone.tokens, 8);
  EXPECT_DOUBLE_EQ(alone.attention_pairs, 25 + 9);
  EXPECT_EQ(MemoryModel::Of(-1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(MemoryModel::Of(1, std::nan("")).status().message(), HasSubstr("bytes_per_token"));
}

TEST(MemoryModelTest, CalibrationRecoversTheTermsFromProbeReadings) {
  // Readings of a hidden model through the fake probe, with +-0.5% noise.
  const double fixed = 3e9, per_token = 2.5e5, per_pair = 40;
  FakeMemoryProbe probe(80LL << 30);
  std::mt19937_64 random(5);
  std::uniform_real_distribution<double> noise(-0.005, 0.005);
  std::vector<PeakSample> samples;
  for (int64_t tokens : {512, 1024, 2048, 4096, 8192, 16384}) {
    for (int64_t sequence : {128, 512, 2048}) {
      const WorkShape shape = WorkShape::Of(tokens, static_cast<double>(tokens * sequence));
      LOCKSTEP_ASSERT_OK(probe.ResetPeak());
      probe.Touch(static_cast<int64_t>(
          (fixed + per_token * tokens + per_pair * shape.attention_pairs) * (1 + noise(random))));
      LOCKSTEP_ASSERT_OK_AND_ASSIGN(MemoryReading reading, probe.Read());
      samples.push_back(PeakSample::Of(shape, static_cast<double>(reading.peak_allocated_bytes)));
    }
  }
  CalibrationOptions options;
  options.attention_term = true;
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Calibration fit, MemoryModel::Calibrate(samples, options));
  EXPECT_NEAR(fit.model.fixed_bytes(), fixed, 0.03 * fixed);
  EXPECT_NEAR(fit.model.bytes_per_token(), per_token, 0.05 * per_token);
  EXPECT_NEAR(fit.model.bytes_per_attention_pair(), per_pair, 0.1 * per_pair);
  EXPECT_LT(fit.worst_relative_error, 0.01);
  EXPECT_GT(fit.worst_relative_error, 0.0);

  // Without the attention term the fit is worse on these readings, and says so.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Calibration linear,
                                MemoryModel::Calibrate(samples, CalibrationOptions()));
  EXPECT_GT(linear.worst_relative_error, fit.worst_relative_error);
}

// What a microbatch leaves held after its forward (outputs, saved activations) is fitted from
// readings of the bytes still allocated, through the origin, when every sample has one.
TEST(MemoryModelTest, CalibrationFitsTheRetainedBytesWhenMeasured) {
  const double fixed = 1e9, per_token = 3e5, retained_per_token = 1.2e5;
  FakeMemoryProbe probe(80LL << 30);
  std::vector<PeakSample> samples;
  for (int64_t tokens : {512, 1024, 4096, 16384}) {
    LOCKSTEP_ASSERT_OK(probe.ResetPeak());
    probe.Touch(static_cast<int64_t>(fixed + per_token * tokens));
    probe.Hold(static_cast<int64_t>(retained_per_token * tokens));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(MemoryReading reading, probe.Read());
    PeakSample sample =
        PeakSample::Of(WorkShape::Of(tokens), static_cast<double>(reading.peak_allocated_bytes));
    sample.retained_bytes = static_cast<double>(reading.allocated_bytes);
    samples.push_back(sample);
  }
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Calibration fit, MemoryModel::Calibrate(samples, {}));
  EXPECT_NEAR(fit.model.retained_bytes_per_token(), retained_per_token, 1e-6 * retained_per_token);
  EXPECT_NEAR(fit.model.PredictRetained(WorkShape::Of(2000)), 2000 * retained_per_token, 1.0);
  EXPECT_LT(fit.worst_retained_relative_error, 1e-6);
  // One sample without the reading: no retained term.
  samples[1].retained_bytes = -1;
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Calibration unmeasured, MemoryModel::Calibrate(samples, {}));
  EXPECT_EQ(unmeasured.model.retained_bytes_per_token(), 0);
  EXPECT_EQ(MemoryModel::Of(1, 1)->WithRetained(-2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MemoryModelTest, CalibrationRefusesWhatCannotBeFitted) {
  EXPECT_THAT(
      MemoryModel::Calibrate({PeakSample::Of(WorkShape::Of(10), 100)}, {}).status().message(),
      HasSubstr("1 samples for 2 terms"));
  const std::vector<PeakSample> same = {PeakSample::Of(WorkShape::Of(10), 100),
                                        PeakSample::Of(WorkShape::Of(10), 101)};
  EXPECT_THAT(MemoryModel::Calibrate(same, {}).status().message(), HasSubstr("only 1 of 2"));
  const std::vector<PeakSample> shrinking = {PeakSample::Of(WorkShape::Of(10), 1000),
                                             PeakSample::Of(WorkShape::Of(20), 500)};
  EXPECT_EQ(MemoryModel::Calibrate(shrinking, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(MemoryModel::Calibrate(
                  {PeakSample::Of(WorkShape::Of(10), -5), PeakSample::Of(WorkShape::Of(20), 9)}, {})
                  .status()
                  .message(),
              HasSubstr("sample 0"));
}

TEST(MemoryModelTest, CorrectionAfterOutOfMemoryNeverPredictsTheFailedWorkToFit) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(MemoryModel model, MemoryModel::Of(100, 1));
  const WorkShape failed = WorkShape::Of(800);
  EXPECT_LT(model.Predict(failed), 1000);
  const double factor = model.CorrectAfterOom(failed, 1000);
  EXPECT_GT(model.Predict(failed), 1000);
  EXPECT_NEAR(factor, 1.05 * 1000 / 900, 1e-12);
  // Never lowered: larger work that failed under the same cap needs no higher factor.
  EXPECT_EQ(model.CorrectAfterOom(WorkShape::Of(5000), 1000), factor);
}

TEST(AdmissionTest, WavesNeverExceedTheCapAndCoverEveryMicrobatchInOrder) {
  std::mt19937_64 random(11);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<int64_t> lengths;
    const int count = 1 + static_cast<int>(random() % 60);
    for (int i = 0; i < count; ++i) lengths.push_back(1 + static_cast<int64_t>(random() % 512));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const planner::Plan plan,
                                  PlanOf(lengths, 512, 1 + static_cast<int>(random() % 2)));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(MemoryModel model, MemoryModel::Of(1e6, 1e3, 2));
    // Above the largest single microbatch (1e6 + 1e3 x 512 + 2 x 512^2 bytes).
    const int64_t cap = 2'100'000 + static_cast<int64_t>(random() % 4'000'000);
    AdmissionOptions options;
    options.max_microbatches_per_wave = 1 + static_cast<int>(random() % 5);
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(Admission admitted, AdmitWaves(plan, model, cap, options));
    int next = 0;
    for (const Wave& wave : admitted.waves) {
      ASSERT_FALSE(wave.microbatches.empty());
      EXPECT_LE(static_cast<int>(wave.microbatches.size()), options.max_microbatches_per_wave);
      WorkShape sum;
      for (int m : wave.microbatches) {
        EXPECT_EQ(m, next++);
        sum = sum + ShapeOfMicrobatch(plan, m);
      }
      EXPECT_DOUBLE_EQ(wave.predicted_bytes, model.Predict(sum));
      EXPECT_LE(wave.predicted_bytes, static_cast<double>(cap));
      EXPECT_GE(wave.headroom_bytes, 0);
      EXPECT_GE(wave.headroom_bytes, admitted.min_headroom_bytes);
    }
    EXPECT_EQ(next, plan.microbatches_size());
  }
}

TEST(AdmissionTest, GreedyWavesFillUpToTheCap) {
  // Four microbatches of 100 tokens; fixed 1000 + 10 per token: two fit under 3000, three do not.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const planner::Plan plan, PlanOf({100, 100, 100, 100}, 100));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(MemoryModel model, MemoryModel::Of(1000, 10));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Admission admitted, AdmitWaves(plan, model, 3000, {}));
  ASSERT_EQ(admitted.waves.size(), 2u);
  EXPECT_EQ(admitted.waves[0].microbatches, (std::vector<int>{0, 1}));
  EXPECT_DOUBLE_EQ(admitted.waves[0].headroom_bytes, 0);
  EXPECT_DOUBLE_EQ(admitted.max_predicted_bytes, 3000);
}

TEST(AdmissionTest, WorkThatCannotFitAloneIsRefusedNamingIt) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const planner::Plan plan, PlanOf({100, 900, 100}, 1000));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(MemoryModel model, MemoryModel::Of(1000, 10));
  absl::StatusOr<Admission> refused = AdmitWaves(plan, model, 8000, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("microbatch 0 (sequences 100, 101; 1000"));
  EXPECT_THAT(refused.status().message(), HasSubstr("10.74 KiB alone, above the cap of 7.81 KiB"));
  EXPECT_EQ(AdmitWaves(plan, model, 0, {}).status().code(), absl::StatusCode::kInvalidArgument);
  AdmissionOptions none;
  none.max_microbatches_per_wave = 0;
  EXPECT_EQ(AdmitWaves(plan, model, 1 << 20, none).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Held until the end (every microbatch's outputs handed back at once): each wave adds what the
// waves before it keep held, and microbatches that fit one by one but not together are refused,
// naming the microbatch and both amounts. Without the option the same plan is admitted.
TEST(AdmissionTest, WorkHeldUntilTheEndAddsUpAndIsRefusedWhenItDoesNotFitTogether) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const planner::Plan plan, PlanOf({100, 100, 100, 100}, 100));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(MemoryModel peak_only, MemoryModel::Of(1000, 10));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(MemoryModel model, peak_only.WithRetained(5));
  AdmissionOptions one_by_one;
  one_by_one.max_microbatches_per_wave = 1;
  AdmissionOptions held = one_by_one;
  held.held_until_the_end = true;
  // Each microbatch alone: 2000; each keeps 500 held. Under 3600 the fourth (2000 + 1500) fits.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Admission fits, AdmitWaves(plan, model, 3600, held));
  ASSERT_EQ(fits.waves.size(), 4u);
  for (int w = 0; w < 4; ++w) {
    EXPECT_DOUBLE_EQ(fits.waves[w].held_bytes, 500.0 * w);
    EXPECT_DOUBLE_EQ(fits.waves[w].predicted_bytes, 2000 + 500.0 * w);
  }
  // Under 3400 it does not, though every microbatch fits alone.
  LOCKSTEP_ASSERT_OK(AdmitWaves(plan, model, 3400, one_by_one).status());
  absl::StatusOr<Admission> refused = AdmitWaves(plan, model, 3400, held);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::AllOf(HasSubstr("microbatch 3 (sequences 103;"),
                               HasSubstr("1.95 KiB on top of 1.46 KiB that the microbatches before "
                                         "it keep held"),
                               HasSubstr("above the cap of 3.32 KiB")));
}

TEST(AdmissionTest, CapsResolveAgainstTheDevice) {
  FakeMemoryProbe probe(1000);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const int64_t fraction,
                                MemoryCap::FractionOfDevice(0.9).Resolve(probe));
  EXPECT_EQ(fraction, 900);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const int64_t bytes, MemoryCap::Bytes(123).Resolve(probe));
  EXPECT_EQ(bytes, 123);
  EXPECT_THAT(MemoryCap::FractionOfDevice(1.5).Resolve(probe).status().message(),
              HasSubstr("fraction 1.5 of the device: must be in (0, 1]"));
  EXPECT_EQ(MemoryCap::Bytes(-4).Resolve(probe).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace admission
}  // namespace lockstep
