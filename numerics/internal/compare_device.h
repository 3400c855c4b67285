// numerics/internal/compare_device.h
//
// Private to numerics/: CompareTensors' figures for two CUDA tensors computed in one fused pass
// on the device (compare_kernel.cu), only the per-block partials copied back. In CPU-only builds
// nothing is handled here.

#ifndef LOCKSTEP_NUMERICS_INTERNAL_COMPARE_DEVICE_H_
#define LOCKSTEP_NUMERICS_INTERNAL_COMPARE_DEVICE_H_

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "numerics/compare.h"
#include "numerics/internal/compare_visit.h"

namespace lockstep {
namespace numerics {
namespace internal {

// Fills `out`'s figures for `actual` against `expected` (same shape, dtype and device, at least
// one element) and returns true, or returns false when the tensors are not on a CUDA device
// this build can compare on.
// Fills `out`'s figures from the reduced partial of a comparison of tensors of shape `sizes`
// (defined in compare.cc, shared by both paths).
void FillComparison(const ComparePartial& total, const Tolerance& tolerance, at::IntArrayRef sizes,
                    TensorComparison& out);

absl::StatusOr<bool> MeasureOnDevice(const at::Tensor& actual, const at::Tensor& expected,
                                     const Tolerance& tolerance, TensorComparison& out);

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_INTERNAL_COMPARE_DEVICE_H_
