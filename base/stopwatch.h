// base/stopwatch.h
//
// Stopwatch: elapsed time on the monotonic clock, for timing bounds and deadlines in tests and
// tools. The wall clock (absl::Now) can jump — NTP, settimeofday — so a bound measured on it can
// pass or fail for reasons unrelated to the code.
//
// Thread-safety: immutable after construction.
//
// Example:
//   const Stopwatch clock;
//   RunTheCall();
//   EXPECT_LT(clock.Elapsed(), absl::Seconds(10));

#ifndef LOCKSTEP_BASE_STOPWATCH_H_
#define LOCKSTEP_BASE_STOPWATCH_H_

#include <chrono>

#include "absl/time/time.h"

namespace lockstep {

// Elapsed time since construction on the monotonic clock (std::chrono::steady_clock).
class Stopwatch {
 public:
  // Starts the stopwatch now.
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  // Time since construction, monotonic.
  absl::Duration Elapsed() const {
    return absl::FromChrono(std::chrono::steady_clock::now() - start_);
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_BASE_STOPWATCH_H_
