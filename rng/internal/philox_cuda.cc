// --config=cuda: partition-invariant Philox on CUDA tensors, through the kernels of
// philox_kernel.cu, on the current stream of the tensor's device.
#include "rng/internal/philox_cuda.h"

#include <optional>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/cuda_boundary.h"
#include "base/element_type_of.h"
#include "base/torch_boundary.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"
#include "rng/internal/philox_box.h"
#include "rng/internal/philox_kernel.h"

namespace lockstep {
namespace rng {
namespace internal {
namespace {

absl::StatusOr<PhiloxBox> MakeBox(absl::Span<const int64_t> strides, absl::Span<const Slice> box) {
  if (box.size() > kMaxPhiloxDims) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA partitioned randomness supports up to ",
                                                   kMaxPhiloxDims, " dimensions, got ",
                                                   box.size()));
  }
  PhiloxBox out;
  out.dims = static_cast<int>(box.size());
  for (size_t d = 0; d < box.size(); ++d) {
    out.begin[d] = box[d].begin;
    out.extent[d] = box[d].end - box[d].begin;
    out.stride[d] = strides[d];
  }
  return out;
}

absl::Status Launched(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return CudaStatus(error, what);
}

}  // namespace

absl::StatusOr<at::Tensor> CudaPhilox(const PhiloxKey& key, const std::vector<int64_t>& strides,
                                      absl::Span<const Slice> box, c10::Device device) {
  absl::StatusOr<PhiloxBox> kernel_box = MakeBox(strides, box);
  if (!kernel_box.ok()) return kernel_box.status();
  at::Tensor out;
  absl::Status status = CallTorch("partitioned uniform on CUDA", [&] {
    c10::cuda::CUDAGuard guard(device);
    out = at::empty(BoxShape(box), at::TensorOptions().dtype(at::kFloat).device(device));
  });
  if (!status.ok()) return status;
  c10::cuda::CUDAGuard guard(device);
  status = Launched(LaunchPhiloxUniform(out.data_ptr<float>(), out.numel(), *kernel_box,
                                        {key.seed, key.stream, key.step},
                                        c10::cuda::getCurrentCUDAStream(device.index()).stream()),
                    "partitioned uniform kernel");
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<at::Tensor> CudaPhiloxDropout(const at::Tensor& shard, const PhiloxKey& key,
                                             const std::vector<int64_t>& strides,
                                             absl::Span<const Slice> box, uint32_t threshold,
                                             double scale) {
  absl::StatusOr<PhiloxBox> kernel_box = MakeBox(strides, box);
  if (!kernel_box.ok()) return kernel_box.status();
  // The floating-point element types the dropout kernel reads (philox_kernel.h).
  const std::optional<ElementType> type = ElementTypeOf(shard.scalar_type());
  if (type != ElementType::kFloat && type != ElementType::kDouble && type != ElementType::kHalf &&
      type != ElementType::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA partitioned dropout does not support ",
                                                   c10::toString(shard.scalar_type())));
  }
  at::Tensor input, out;
  absl::Status status = CallTorch("partitioned dropout on CUDA", [&] {
    c10::cuda::CUDAGuard guard(shard.device());
    input = shard.contiguous();
    out = at::empty_like(input);
  });
  if (!status.ok()) return status;
  c10::cuda::CUDAGuard guard(shard.device());
  status = Launched(
      LaunchPhiloxDropout(input.data_ptr(), out.data_ptr(), *type, input.numel(), *kernel_box,
                          {key.seed, key.stream, key.step}, threshold, scale,
                          c10::cuda::getCurrentCUDAStream(shard.device().index()).stream()),
      "partitioned dropout kernel");
  if (!status.ok()) return status;
  return out;
}

}  // namespace internal
}  // namespace rng
}  // namespace lockstep
