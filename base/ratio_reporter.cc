#include "base/ratio_reporter.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace benchmarking {

void RatioReporter::ReportRuns(const std::vector<Run>& runs) {
  for (const Run& run : runs) {
    reported_.insert(run.benchmark_name());
    if (run.error_occurred) {
      std::cerr << "benchmark " << run.benchmark_name()
                << " could not measure: " << run.error_message << std::endl;
      ++failed_runs_;
      continue;
    }
    seconds_[run.benchmark_name()] = run.GetAdjustedRealTime();
    for (const auto& [key, counter] : run.counters) {
      counters_[run.benchmark_name()][key] = counter.value;
    }
  }
  ConsoleReporter::ReportRuns(runs);
}

std::optional<double> RatioReporter::Seconds(const std::string& name) const {
  auto it = seconds_.find(name);
  if (it == seconds_.end()) return std::nullopt;
  return it->second;
}

void RatioReporter::PrintInfo(const std::string& what, const std::string& numerator,
                              const std::string& denominator) const {
  std::optional<double> n = Seconds(numerator), d = Seconds(denominator);
  if (!n.has_value() || !d.has_value()) return;
  std::cout << absl::StrCat("ratio ", what, ": ", *n / *d, " (for context; no target)")
            << std::endl;
}

void RatioReporter::PrintCounter(const std::string& what, const std::string& name,
                                 const std::string& counter, double target) {
  auto run = counters_.find(name);
  const bool found = run != counters_.end() && run->second.count(counter) > 0;
  if (!found) {
    // Google Benchmark runs everything for an empty filter, "." or "all".
    const std::string filter = benchmark::GetBenchmarkFilter();
    if (reported_.count(name) == 0 && !filter.empty() && filter != "." && filter != "all") {
      std::cerr << "ratio " << what << ": not measured (run '" << name
                << "' left out by --benchmark_filter=" << filter << ")" << std::endl;
      return;
    }
    std::cerr << "ratio " << what << ": NOT MEASURED (no counter '" << counter << "' of run '"
              << name << "'; the run was filtered out, skipped or failed)" << std::endl;
    ++unmeasured_;
    return;
  }
  PrintLine(what, run->second.at(counter), target);
}

void RatioReporter::PrintCounterInfo(const std::string& what, const std::string& name,
                                     const std::string& counter) const {
  auto run = counters_.find(name);
  if (run == counters_.end() || run->second.count(counter) == 0) return;
  std::cout << "  " << what << ": " << run->second.at(counter) << std::endl;
}

size_t PairedSamples::count(const std::string& name) const {
  auto it = samples_.find(name);
  return it == samples_.end() ? 0 : it->second.size();
}

double PairedSamples::Median(const std::string& name) const {
  auto it = samples_.find(name);
  if (it == samples_.end() || it->second.empty()) return 0;
  std::vector<double> v = it->second;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

bool PairedSamples::Publish(benchmark::State& state, size_t min_samples) const {
  for (const auto& [name, values] : samples_) {
    if (values.size() < min_samples) {
      state.SkipWithError(absl::StrCat(name, ": only ", values.size(),
                                       " timed iterations; figures need at least ", min_samples)
                              .c_str());
      return false;
    }
  }
  for (const auto& [name, values] : samples_) state.counters[name + "_median_us"] = Median(name);
  return true;
}

void RatioReporter::PrintLine(const std::string& what, double ratio, double target) {
  std::cout << absl::StrCat("ratio ", what, ": ", ratio, " (target <= ", target, ": ",
                            ratio <= target ? "met" : "NOT met", ")")
            << std::endl;
}

}  // namespace benchmarking
}  // namespace lockstep
