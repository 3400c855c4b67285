// testing/fake_memory_probe.h
//
// FakeMemoryProbe (testonly): a MemoryProbe whose readings the test drives. Work "touches" a
// byte count (the peak it would reach) and may hold bytes (what stays allocated); Read reports the
// largest touch since ResetPeak and what is held; releases are counted; the device total is set by
// the test. Failures can be scripted per method.
//
// Thread-safety: all methods are safe concurrently (a mutex), so thread worlds may share one.

#ifndef LOCKSTEP_TESTING_FAKE_MEMORY_PROBE_H_
#define LOCKSTEP_TESTING_FAKE_MEMORY_PROBE_H_

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/synchronization/mutex.h"
#include "admission/memory_probe.h"

namespace lockstep {
namespace admission {

class FakeMemoryProbe : public MemoryProbe {
 public:
  explicit FakeMemoryProbe(int64_t device_total_bytes) : total_(device_total_bytes) {}

  // Work reached `bytes` at its peak.
  void Touch(int64_t bytes) {
    absl::MutexLock lock(&mu_);
    peak_ = std::max(peak_, bytes);
  }
  // Work left `bytes` held (what tensors hold now; Read's allocated_bytes).
  void Hold(int64_t bytes) {
    absl::MutexLock lock(&mu_);
    held_ = bytes;
    peak_ = std::max(peak_, bytes);
  }
  int releases() const {
    absl::MutexLock lock(&mu_);
    return releases_;
  }
  // The next Read fails with `status` (once).
  void FailNextRead(absl::Status status) {
    absl::MutexLock lock(&mu_);
    read_failure_ = std::move(status);
  }

  absl::Status ResetPeak() override {
    absl::MutexLock lock(&mu_);
    peak_ = 0;
    return absl::OkStatus();
  }
  absl::StatusOr<MemoryReading> Read() override {
    absl::MutexLock lock(&mu_);
    if (!read_failure_.ok()) {
      absl::Status failure = read_failure_;
      read_failure_ = absl::OkStatus();
      return failure;
    }
    MemoryReading reading;
    reading.peak_allocated_bytes = peak_;
    reading.peak_reserved_bytes = peak_;
    reading.allocated_bytes = held_;
    return reading;
  }
  absl::Status ReleaseCachedMemory() override {
    absl::MutexLock lock(&mu_);
    ++releases_;
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> DeviceTotalBytes() override {
    absl::MutexLock lock(&mu_);
    return total_;
  }
  std::string DeviceName() const override { return "fake"; }

 private:
  mutable absl::Mutex mu_;
  int64_t total_;
  int64_t peak_ = 0;
  int64_t held_ = 0;
  int releases_ = 0;
  absl::Status read_failure_;
};

}  // namespace admission
}  // namespace lockstep

#endif  // LOCKSTEP_TESTING_FAKE_MEMORY_PROBE_H_
