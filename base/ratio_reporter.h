// base/ratio_reporter.h
//
// RatioReporter is Google Benchmark's console reporter that also remembers each run's real time
// and counters by benchmark name, so that a benchmark binary can print, after its runs, the
// ratios its targets are stated in ("synchronize / bare broadcast <= 1.2"). A ratio with a target
// comes from a paired loop (PairedSamples: both sides alternate in one loop, each timed on its
// own, medians compared); ratios of separate runs are printed for context only, without a target.
// A target ratio that could not be measured is reported on stderr and makes all_measured() false,
// so the binary can exit non-zero; so does a run that ended in an error (SkipWithError). A target
// whose run a --benchmark_filter left out is reported on stderr as filtered out and is not a
// failure: a filtered run (tools/benchmark_smoke.sh's, at a minimal size) measures what it ran.
//
// Example:
//   benchmarking::RatioReporter reporter;
//   benchmark::RunSpecifiedBenchmarks(&reporter);
//   reporter.PrintCounter("ours / torch", "BM_Paired/real_time", "ratio", 2.0);
//   return reporter.all_measured() ? 0 : 1;

#ifndef LOCKSTEP_BASE_RATIO_REPORTER_H_
#define LOCKSTEP_BASE_RATIO_REPORTER_H_

#include <map>
#include <optional>
#include <set>
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
  // for benchmarks that compute their own ratio of paired medians. When the run or the counter is
  // missing, says so on stderr and records that a target went unmeasured, unless the run never
  // reported and a --benchmark_filter is set (it was filtered out: said on stderr, not recorded).
  void PrintCounter(const std::string& what, const std::string& name, const std::string& counter,
                    double target);

  // Prints "  <what>: <value of counter `counter` of run `name`>" with no target (a context
  // figure beside a target's line); nothing when the run or the counter is missing.
  void PrintCounterInfo(const std::string& what, const std::string& name,
                        const std::string& counter) const;

  // Whether every run measured (none skipped with an error, which is also said on stderr) and
  // every PrintCounter found its figure.
  bool all_measured() const { return unmeasured_ == 0 && failed_runs_ == 0; }

 private:
  std::set<std::string> reported_;  // every run reported, errors included
  std::map<std::string, double> seconds_;
  std::map<std::string, std::map<std::string, double>> counters_;
  int unmeasured_ = 0;
  int failed_runs_ = 0;
};

// The timings of a paired loop: each operation of an iteration timed on its own, all operations
// alternating in one loop so that they see the same machine state; reported as medians, which
// resist the scheduler's outliers.
class PairedSamples {
 public:
  void Add(const std::string& name, double value) { samples_[name].push_back(value); }
  size_t count(const std::string& name) const;
  // The median of `name`'s samples; 0 when there are none.
  double Median(const std::string& name) const;
  // Sets state.counters["<name>_median_us"] for every operation, and, unless every operation
  // has at least `min_samples` samples, fails the benchmark saying so (a figure from fewer
  // iterations is not reported). Returns whether it published.
  bool Publish(benchmark::State& state, size_t min_samples = 10) const;

 private:
  std::map<std::string, std::vector<double>> samples_;
};

}  // namespace benchmarking
}  // namespace lockstep

#endif  // LOCKSTEP_BASE_RATIO_REPORTER_H_
