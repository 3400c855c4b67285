// base/ratio_reporter: target ratios come from the runs' counters, a missing figure is reported
// and remembered, and paired samples give medians.

#include "base/ratio_reporter.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace benchmarking {
namespace {

using ::testing::HasSubstr;

benchmark::BenchmarkReporter::Run MakeRun(const std::string& name, double seconds, double ratio) {
  benchmark::BenchmarkReporter::Run run;
  run.run_name.function_name = name;
  run.iterations = 10;
  run.real_accumulated_time = seconds * 10;
  run.cpu_accumulated_time = seconds * 10;
  run.time_unit = benchmark::kSecond;
  run.counters["ratio"] = ratio;
  run.statistics = nullptr;
  return run;
}

TEST(RatioReporterTest, PrintsCountersAgainstTargetsAndRemembersMissingOnes) {
  RatioReporter reporter;
  testing::internal::CaptureStdout();
  reporter.ReportRuns({MakeRun("BM_Paired", 2.0, 1.05)});
  testing::internal::CaptureStderr();
  reporter.PrintCounter("sync / bare", "BM_Paired", "ratio", 1.2);
  reporter.PrintCounter("too slow", "BM_Paired", "ratio", 1.0);
  EXPECT_TRUE(reporter.all_measured());
  reporter.PrintCounter("absent", "BM_Filtered", "ratio", 1.2);
  const std::string err = testing::internal::GetCapturedStderr();
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_THAT(out, HasSubstr("ratio sync / bare: 1.05 (target <= 1.2: met)"));
  EXPECT_THAT(out, HasSubstr("ratio too slow: 1.05 (target <= 1: NOT met)"));
  EXPECT_THAT(err, HasSubstr("ratio absent: NOT MEASURED"));
  EXPECT_FALSE(reporter.all_measured());
  ASSERT_TRUE(reporter.Seconds("BM_Paired").has_value());
  EXPECT_DOUBLE_EQ(*reporter.Seconds("BM_Paired"), 2.0);
  EXPECT_FALSE(reporter.Seconds("BM_Filtered").has_value());
}

// A run that a --benchmark_filter left out is said to be filtered out, not a failure; a run that
// reported without its counter, or ended in an error, still is one.
TEST(RatioReporterTest, ARunLeftOutByAFilterIsNotAFailure) {
  const std::string filter = benchmark::GetBenchmarkFilter();
  benchmark::SetBenchmarkFilter("BM_Paired");
  RatioReporter reporter;
  benchmark::BenchmarkReporter::Run failed = MakeRun("BM_Failed", 1.0, 1.0);
  failed.error_occurred = true;
  failed.error_message = "no device";
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  reporter.ReportRuns({MakeRun("BM_Paired", 2.0, 1.05)});
  reporter.PrintCounter("left out", "BM_Other", "ratio", 1.2);
  const std::string left_out = testing::internal::GetCapturedStderr();
  EXPECT_THAT(left_out, HasSubstr("ratio left out: not measured (run 'BM_Other' left out by "
                                  "--benchmark_filter=BM_Paired)"));
  EXPECT_TRUE(reporter.all_measured());
  testing::internal::CaptureStderr();
  reporter.PrintCounter("no such counter", "BM_Paired", "missing", 1.2);
  EXPECT_FALSE(reporter.all_measured());
  RatioReporter errors;
  errors.ReportRuns({failed});
  errors.PrintCounter("failed", "BM_Failed", "ratio", 1.2);
  const std::string err = testing::internal::GetCapturedStderr();
  testing::internal::GetCapturedStdout();
  EXPECT_THAT(err, HasSubstr("ratio no such counter: NOT MEASURED"));
  EXPECT_THAT(err, HasSubstr("benchmark BM_Failed could not measure: no device"));
  EXPECT_FALSE(errors.all_measured());
  benchmark::SetBenchmarkFilter(filter);
}

TEST(PairedSamplesTest, MediansAndCounts) {
  PairedSamples samples;
  for (double v : {5.0, 1.0, 100.0, 3.0, 2.0}) samples.Add("a", v);
  samples.Add("b", 7.0);
  EXPECT_EQ(samples.count("a"), 5u);
  EXPECT_EQ(samples.count("missing"), 0u);
  EXPECT_DOUBLE_EQ(samples.Median("a"), 3.0);  // the outlier does not move it
  EXPECT_DOUBLE_EQ(samples.Median("b"), 7.0);
  EXPECT_DOUBLE_EQ(samples.Median("missing"), 0.0);
}

}  // namespace
}  // namespace benchmarking
}  // namespace lockstep
