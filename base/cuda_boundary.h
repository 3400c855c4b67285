// base/cuda_boundary.h  (built only under --config=cuda)
//
// The one place where CUDA runtime errors become absl::Status, beside torch_boundary.h for
// LibTorch's exceptions and with the same codes for the same conditions, so that callers
// (admission's recovery above all) tell "out of memory" from a fault whichever API reported it:
//   cudaErrorMemoryAllocation                    -> kResourceExhausted (back off / shrink)
//   cudaErrorInvalidValue, cudaErrorInvalidDevice -> kInvalidArgument  (fix the input)
//   every other error                             -> kInternal
// The message is "<context>: CUDA <error name>: <error text>" (Note [Context order] in
// torch_boundary.h: callers append outer context with Annotate).
//
// Thread-safety: stateless.
//
// Example:
//   LOCKSTEP_RETURN_IF_ERROR(
//       CudaStatus(cudaHostAlloc(&host, bytes, cudaHostAllocMapped), "allocating staging memory"));

#ifndef LOCKSTEP_BASE_CUDA_BOUNDARY_H_
#define LOCKSTEP_BASE_CUDA_BOUNDARY_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace lockstep {

// OK for cudaSuccess; otherwise the mapped status, its message starting with `context`.
absl::Status CudaStatus(cudaError_t error, absl::string_view context);

}  // namespace lockstep

#endif  // LOCKSTEP_BASE_CUDA_BOUNDARY_H_
