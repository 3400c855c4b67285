#include "ATen/ATen.h"
#include "base/status_macros.h"
#include "invariant/internal/cuda_launch.h"
#include "invariant/internal/device_exact.h"
#include "invariant/internal/exact_kernels.h"

namespace lockstep {
namespace invariant {
namespace internal {
namespace {

unsigned long long* Words(at::Tensor& sums) {
  return reinterpret_cast<unsigned long long*>(sums.data_ptr<int64_t>());
}
const unsigned long long* Words(const at::Tensor& sums) {
  return reinterpret_cast<const unsigned long long*>(sums.data_ptr<int64_t>());
}

}  // namespace

absl::Status CudaAddOuterProducts(const at::Tensor& a, const at::Tensor& b, int fraction_bits,
                                  at::Tensor& sums) {
  return LaunchOn("the exact outer products on CUDA", a, [&](cudaStream_t stream) {
    return LaunchAddOuterProducts(a.data_ptr<float>(), b.data_ptr<float>(), a.size(0), a.size(1),
                                  b.size(1), fraction_bits, Words(sums), stream);
  });
}

absl::Status CudaAddRows(const at::Tensor& rows, const at::Tensor& values, int fraction_bits,
                         at::Tensor& sums) {
  return LaunchOn("the exact rows on CUDA", values, [&](cudaStream_t stream) {
    return LaunchAddRows(rows.data_ptr<int64_t>(), values.data_ptr<double>(), values.size(0),
                         values.size(1), fraction_bits, Words(sums), stream);
  });
}

absl::Status CudaAddColumns(const at::Tensor& values, int fraction_bits, at::Tensor& sums) {
  return LaunchOn("the exact columns on CUDA", values, [&](cudaStream_t stream) {
    return LaunchAddColumns(values.data_ptr<double>(), values.size(0), values.size(1),
                            fraction_bits, Words(sums), stream);
  });
}

absl::Status CudaAddWords(const at::Tensor& addend, at::Tensor& sums) {
  return LaunchOn("the exact sums' addition on CUDA", sums, [&](cudaStream_t stream) {
    return LaunchAddWords(Words(addend), sums.size(0), Words(sums), stream);
  });
}

absl::StatusOr<at::Tensor> CudaToLimbs(const at::Tensor& sums) {
  at::Tensor limbs;
  LOCKSTEP_RETURN_IF_ERROR(LaunchOn("the exact sums' limbs on CUDA", sums, [&](cudaStream_t s) {
    limbs = at::empty({sums.size(0), 4}, sums.options());
    return LaunchToLimbs(Words(sums), sums.size(0), limbs.data_ptr<int64_t>(), s);
  }));
  return limbs;
}

absl::Status CudaFromLimbs(const at::Tensor& limbs, at::Tensor& sums) {
  return LaunchOn("the exact sums' carries on CUDA", sums, [&](cudaStream_t stream) {
    return LaunchFromLimbs(limbs.data_ptr<int64_t>(), sums.size(0), Words(sums), stream);
  });
}

absl::StatusOr<at::Tensor> CudaToDouble(const at::Tensor& sums, int fraction_bits) {
  at::Tensor out;
  LOCKSTEP_RETURN_IF_ERROR(LaunchOn("the exact sums' rounding on CUDA", sums, [&](cudaStream_t s) {
    out = at::empty({sums.size(0)}, sums.options().dtype(at::kDouble));
    return LaunchToDouble(Words(sums), sums.size(0), fraction_bits, out.data_ptr<double>(), s);
  }));
  return out;
}

}  // namespace internal
}  // namespace invariant
}  // namespace lockstep
