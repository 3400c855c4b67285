// admission/memory_probe.h
//
// Where memory readings come from. The recovery loop and calibration read peaks through this
// interface: CudaMemoryProbe (cuda_memory_probe.h, --config=cuda) reads the CUDA caching
// allocator's statistics; on CPU, callers and tests supply their own (FakeMemoryProbe in
// fake_memory_probe.h is the test double).
//
// Contract: ResetPeak starts a measurement; Read returns the peaks since the last ResetPeak;
// ReleaseCachedMemory returns memory the allocator caches but no tensor uses (after an
// out-of-memory failure, so the retry starts from what is really free); DeviceTotalBytes is the
// capacity a fractional cap refers to. Errors are statuses naming the device.
//
// Thread-safety: as the implementation's; the CUDA probe is safe across threads, its readings
// cover every thread's allocations on the device.

#ifndef LOCKSTEP_ADMISSION_MEMORY_PROBE_H_
#define LOCKSTEP_ADMISSION_MEMORY_PROBE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lockstep {
namespace admission {

// What a MemoryProbe reads: the peaks since the last ResetPeak, and the bytes allocated now.
struct MemoryReading {
  // Peak bytes held by tensors since the last ResetPeak.
  int64_t peak_allocated_bytes = 0;
  // Peak bytes the allocator reserved from the device since the last ResetPeak.
  int64_t peak_reserved_bytes = 0;
  // Bytes held by tensors now.
  int64_t allocated_bytes = 0;
};

// The memory readings of one device (see the top of this file).
class MemoryProbe {
 public:
  virtual ~MemoryProbe() = default;
  // Starts a measurement: the peaks Read reports from now on start at the bytes held now.
  virtual absl::Status ResetPeak() = 0;
  // The peaks since the last ResetPeak, and the bytes allocated now.
  virtual absl::StatusOr<MemoryReading> Read() = 0;
  // Returns to the device the memory the allocator caches but no tensor uses.
  virtual absl::Status ReleaseCachedMemory() = 0;
  // The device's total memory in bytes: what MemoryCap::FractionOfDevice is a fraction of.
  virtual absl::StatusOr<int64_t> DeviceTotalBytes() = 0;
  // "cuda:0", "fake", ... for messages.
  virtual std::string DeviceName() const = 0;
};

}  // namespace admission
}  // namespace lockstep

#endif  // LOCKSTEP_ADMISSION_MEMORY_PROBE_H_
