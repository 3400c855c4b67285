#include "ATen/ATen.h"
#include "base/cuda_boundary.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"
#include "invariant/internal/device_exact.h"
#include "invariant/internal/exact_kernels.h"

namespace lockstep {
namespace invariant {
namespace internal {
namespace {

cudaStream_t StreamOf(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

unsigned long long* Words(at::Tensor& sums) {
  return reinterpret_cast<unsigned long long*>(sums.data_ptr<int64_t>());
}

}  // namespace

absl::Status CudaAddOuterProducts(const at::Tensor& a, const at::Tensor& b, int fraction_bits,
                                  at::Tensor& sums) {
  cudaError_t error = cudaSuccess;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact outer products on CUDA", [&] {
    c10::cuda::CUDAGuard guard(a.device());
    error = LaunchAddOuterProducts(a.data_ptr<float>(), b.data_ptr<float>(), a.size(0), a.size(1),
                                   b.size(1), fraction_bits, Words(sums), StreamOf(a));
  }));
  return CudaStatus(error, "launching the exact outer products");
}

absl::Status CudaAddRows(const at::Tensor& rows, const at::Tensor& values, int fraction_bits,
                         at::Tensor& sums) {
  cudaError_t error = cudaSuccess;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact rows on CUDA", [&] {
    c10::cuda::CUDAGuard guard(values.device());
    error = LaunchAddRows(rows.data_ptr<int64_t>(), values.data_ptr<double>(), values.size(0),
                          values.size(1), fraction_bits, Words(sums), StreamOf(values));
  }));
  return CudaStatus(error, "launching the exact rows");
}

absl::Status CudaAddColumns(const at::Tensor& values, int fraction_bits, at::Tensor& sums) {
  cudaError_t error = cudaSuccess;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact columns on CUDA", [&] {
    c10::cuda::CUDAGuard guard(values.device());
    error = LaunchAddColumns(values.data_ptr<double>(), values.size(0), values.size(1),
                             fraction_bits, Words(sums), StreamOf(values));
  }));
  return CudaStatus(error, "launching the exact columns");
}

absl::Status CudaAddWords(const at::Tensor& addend, at::Tensor& sums) {
  cudaError_t error = cudaSuccess;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("adding exact sums on CUDA", [&] {
    c10::cuda::CUDAGuard guard(sums.device());
    error = LaunchAddWords(reinterpret_cast<const unsigned long long*>(addend.data_ptr<int64_t>()),
                           sums.size(0), Words(sums), StreamOf(sums));
  }));
  return CudaStatus(error, "launching the exact sums' addition");
}

absl::StatusOr<at::Tensor> CudaToLimbs(const at::Tensor& sums) {
  at::Tensor limbs;
  cudaError_t error = cudaSuccess;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact sums as limbs on CUDA", [&] {
    c10::cuda::CUDAGuard guard(sums.device());
    limbs = at::empty({sums.size(0), 4}, sums.options());
    error = LaunchToLimbs(reinterpret_cast<const unsigned long long*>(sums.data_ptr<int64_t>()),
                          sums.size(0), limbs.data_ptr<int64_t>(), StreamOf(sums));
  }));
  LOCKSTEP_RETURN_IF_ERROR(CudaStatus(error, "launching the exact sums' limbs"));
  return limbs;
}

absl::Status CudaFromLimbs(const at::Tensor& limbs, at::Tensor& sums) {
  cudaError_t error = cudaSuccess;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact sums from limbs on CUDA", [&] {
    c10::cuda::CUDAGuard guard(sums.device());
    error = LaunchFromLimbs(limbs.data_ptr<int64_t>(), sums.size(0), Words(sums), StreamOf(sums));
  }));
  return CudaStatus(error, "launching the exact sums' carries");
}

absl::StatusOr<at::Tensor> CudaToDouble(const at::Tensor& sums, int fraction_bits) {
  at::Tensor out;
  cudaError_t error = cudaSuccess;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact sums as float64 on CUDA", [&] {
    c10::cuda::CUDAGuard guard(sums.device());
    out = at::empty({sums.size(0)}, sums.options().dtype(at::kDouble));
    error = LaunchToDouble(reinterpret_cast<const unsigned long long*>(sums.data_ptr<int64_t>()),
                           sums.size(0), fraction_bits, out.data_ptr<double>(), StreamOf(sums));
  }));
  LOCKSTEP_RETURN_IF_ERROR(CudaStatus(error, "launching the exact sums' rounding"));
  return out;
}

}  // namespace internal
}  // namespace invariant
}  // namespace lockstep
