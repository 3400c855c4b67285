#include "base/ratio_reporter.h"

#include <iostream>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace benchmarking {

void RatioReporter::ReportRuns(const std::vector<Run>& runs) {
  for (const Run& run : runs) {
    if (run.error_occurred) continue;
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

void RatioReporter::PrintRatio(const std::string& what, const std::string& numerator,
                               const std::string& denominator, double target) const {
  std::optional<double> n = Seconds(numerator), d = Seconds(denominator);
  if (!n.has_value() || !d.has_value()) return;
  PrintLine(what, *n / *d, target);
}

void RatioReporter::PrintInfo(const std::string& what, const std::string& numerator,
                              const std::string& denominator) const {
  std::optional<double> n = Seconds(numerator), d = Seconds(denominator);
  if (!n.has_value() || !d.has_value()) return;
  std::cout << absl::StrCat("ratio ", what, ": ", *n / *d, " (for context; no target)")
            << std::endl;
}

void RatioReporter::PrintCounter(const std::string& what, const std::string& name,
                                 const std::string& counter, double target) const {
  auto run = counters_.find(name);
  if (run == counters_.end()) return;
  auto value = run->second.find(counter);
  if (value == run->second.end()) return;
  PrintLine(what, value->second, target);
}

void RatioReporter::PrintLine(const std::string& what, double ratio, double target) {
  std::cout << absl::StrCat("ratio ", what, ": ", ratio, " (target <= ", target, ": ",
                            ratio <= target ? "met" : "NOT met", ")")
            << std::endl;
}

}  // namespace benchmarking
}  // namespace lockstep
