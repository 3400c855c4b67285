// CPU-only builds: no CUDA runtime, driver, NCCL or devices to record.
#include "numerics/internal/device_context.h"

namespace lockstep {
namespace numerics {
namespace internal {

nlohmann::json DeviceContext() { return {{"built_with_cuda", false}}; }

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
