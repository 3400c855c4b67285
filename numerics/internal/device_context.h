// numerics/internal/device_context.h
//
// Private to numerics/: the CUDA part of an execution context (numerics/execution_context.h):
// runtime, driver, NCCL and cuBLAS versions and each visible device's name and UUID. In
// CPU-only builds: {"built_with_cuda": false}.

#ifndef LOCKSTEP_NUMERICS_INTERNAL_DEVICE_CONTEXT_H_
#define LOCKSTEP_NUMERICS_INTERNAL_DEVICE_CONTEXT_H_

#include "nlohmann/json.hpp"

namespace lockstep {
namespace numerics {
namespace internal {

nlohmann::json DeviceContext();

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_INTERNAL_DEVICE_CONTEXT_H_
