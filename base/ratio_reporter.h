// base/ratio_reporter.h
//
// RatioReporter is Google Benchmark's console reporter that also remembers each run's real time
// by benchmark name, so that a benchmark binary can print, after its runs, the ratios its targets
// are stated in ("synchronize / bare broadcast <= 1.2") — both sides measured in the same run.
//
// Example:
//   benchmarking::RatioReporter reporter;
//   benchmark::RunSpecifiedBenchmarks(&reporter);
//   reporter.PrintRatio("ours / torch", "BM_Ours/real_time", "BM_Torch/real_time", 2.0);

#ifndef LOCKSTEP_BASE_RATIO_REPORTER_H_
#define LOCKSTEP_BASE_RATIO_REPORTER_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"

namespace lockstep {
namespace benchmarking {

class RatioReporter : public benchmark::ConsoleReporter {
 public:
  RatioReporter() : ConsoleReporter(OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& runs) override;

  // Real time per iteration of the named run, in the run's time unit; nullopt if it did not run
  // (filtered out, skipped, or failed).
  std::optional<double> Seconds(const std::string& name) const;

  // Prints "ratio <what>: <ratio> (target <= <target>: met|NOT met)" for a ratio computed by the
  // caller.
  static void PrintLine(const std::string& what, double ratio, double target);

  // Prints "ratio <what>: <numerator / denominator>" with no target (context figures).
  void PrintInfo(const std::string& what, const std::string& numerator,
                 const std::string& denominator) const;

  // Prints "ratio <what>: <value of counter `counter` of run `name`> (target <= <target>: ...)"
  // for benchmarks that compute their own ratio (e.g. of paired medians); nothing if absent.
  void PrintCounter(const std::string& what, const std::string& name, const std::string& counter,
                    double target) const;

  // Prints "ratio <what>: <numerator / denominator> (target <= <target>: met|NOT met)" when both
  // runs exist; prints nothing otherwise.
  void PrintRatio(const std::string& what, const std::string& numerator,
                  const std::string& denominator, double target) const;

 private:
  std::map<std::string, double> seconds_;
  std::map<std::string, std::map<std::string, double>> counters_;
};

}  // namespace benchmarking
}  // namespace lockstep

#endif  // LOCKSTEP_BASE_RATIO_REPORTER_H_
