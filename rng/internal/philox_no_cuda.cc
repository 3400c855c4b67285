// CPU-only builds: CUDA tensors cannot be produced.
#include "absl/strings/str_cat.h"
#include "rng/internal/philox_cuda.h"

namespace lockstep {
namespace rng {
namespace internal {

absl::StatusOr<at::Tensor> CudaPhilox(const PhiloxKey&, const std::vector<int64_t>&,
                                      absl::Span<const Slice>, c10::Device device) {
  return absl::FailedPreconditionError(
      absl::StrCat("partitioned randomness on ", device.str(),
                   " needs a CUDA build of lockstep (--config=cuda)"));
}

absl::StatusOr<at::Tensor> CudaPhiloxDropout(const at::Tensor& shard, const PhiloxKey&,
                                             const std::vector<int64_t>&, absl::Span<const Slice>,
                                             uint32_t, double) {
  return absl::FailedPreconditionError(
      absl::StrCat("partitioned dropout on ", shard.device().str(),
                   " needs a CUDA build of lockstep (--config=cuda)"));
}

}  // namespace internal
}  // namespace rng
}  // namespace lockstep
