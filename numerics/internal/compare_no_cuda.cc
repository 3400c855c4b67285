// CPU-only builds: no CUDA tensors exist; every comparison runs through ATen on the CPU.
#include "numerics/internal/compare_device.h"

namespace lockstep {
namespace numerics {
namespace internal {

absl::StatusOr<bool> MeasureOnDevice(const at::Tensor&, const at::Tensor&, const Tolerance&,
                                     TensorComparison&) {
  return false;
}

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
