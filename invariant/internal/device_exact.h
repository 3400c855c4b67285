// invariant/internal/device_exact.h
//
// ExactGradients' deposits on CUDA (exact_kernels.h) over LibTorch tensors, on the current
// stream of their device. `sums` is an int64 tensor [elements, 2] on that device (each element's
// low and high words); the caller has checked every contribution's range. In a build without
// CUDA each returns kUnimplemented.

#ifndef LOCKSTEP_INVARIANT_INTERNAL_DEVICE_EXACT_H_
#define LOCKSTEP_INVARIANT_INTERNAL_DEVICE_EXACT_H_

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lockstep {
namespace invariant {
namespace internal {

// sums[n, k] += a^T b, for float32 contiguous a [T, n] and b [T, k].
absl::Status CudaAddOuterProducts(const at::Tensor& a, const at::Tensor& b, int fraction_bits,
                                  at::Tensor& sums);
// sums[rows[t], :] += values[t, :], for int64 rows [T] and float64 values [T, k], contiguous.
absl::Status CudaAddRows(const at::Tensor& rows, const at::Tensor& values, int fraction_bits,
                         at::Tensor& sums);
// sums[:] += the column sums of float64 contiguous values [T, k].
absl::Status CudaAddColumns(const at::Tensor& values, int fraction_bits, at::Tensor& sums);
// sums += addend (both int64 [elements, 2] on one device, as sums).
absl::Status CudaAddWords(const at::Tensor& addend, at::Tensor& sums);
// The sums as 32-bit limbs, int64 [elements, 4] (exact_kernels.h's LaunchToLimbs), and back.
absl::StatusOr<at::Tensor> CudaToLimbs(const at::Tensor& sums);
absl::Status CudaFromLimbs(const at::Tensor& limbs, at::Tensor& sums);
// The sums as float64 [elements], each times 2^-fraction_bits rounded once (as the host's).
absl::StatusOr<at::Tensor> CudaToDouble(const at::Tensor& sums, int fraction_bits);

}  // namespace internal
}  // namespace invariant
}  // namespace lockstep

#endif  // LOCKSTEP_INVARIANT_INTERNAL_DEVICE_EXACT_H_
