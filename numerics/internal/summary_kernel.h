// numerics/internal/summary_kernel.h
//
// Private to numerics/: the CUDA kernel that summarizes a device buffer of numbers — its sum and
// max |x|, in double — for the operator recorder's output figures (op_recorder.h), reading each
// element once in its own dtype (no converted copy), compiled by nvcc (summary_kernel.cu). Plain
// C++ interface, so nvcc never parses LibTorch.
//
// Note [Summary partials]
// Each block of the launch writes one partial, two doubles (its sum, its max |x|), and the host
// finishes them (FinishSummaryPartials, summary_partials.h) in block order. The launch's shape and
// every thread's order of addition depend only on the element count, so a summary is the same
// bits on every run and every GPU: two recordings of the same contents give the same figures.
// A NaN anywhere makes both figures NaN, as ATen's sum and infinity norm do.

#ifndef LOCKSTEP_NUMERICS_INTERNAL_SUMMARY_KERNEL_H_
#define LOCKSTEP_NUMERICS_INTERNAL_SUMMARY_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/element_type.h"

namespace lockstep {
namespace numerics {
namespace internal {

// The partials (blocks) a summary of `count` elements (count > 0) has.
int SummaryPartials(uint64_t count);

// Summarizes `count` (> 0) contiguous elements at `data` (device memory, aligned to the element
// size) into partials[2 * SummaryPartials(count)] (device memory), on `stream`.
cudaError_t LaunchSummary(const void* data, uint64_t count, ElementType type, double* partials,
                          cudaStream_t stream);

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_INTERNAL_SUMMARY_KERNEL_H_
