// numerics/internal/chunk_hash_device.h
//
// Private to numerics/: the digest chunk hashes of a tensor on a device (DIGEST.md step 2),
// computed there: the CUDA kernel under --config=cuda, a refusal in CPU-only builds (where no
// CUDA tensor can exist).

#ifndef LOCKSTEP_NUMERICS_INTERNAL_CHUNK_HASH_DEVICE_H_
#define LOCKSTEP_NUMERICS_INTERNAL_CHUNK_HASH_DEVICE_H_

#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace lockstep {
namespace numerics {
namespace internal {

// The chunk hashes of each tensor (all CUDA tensors), 16 bytes per chunk of its logical
// contiguous bytes in chunk order: one kernel per device over all of that device's tensors, on its
// current stream, into one buffer copied back once (Note [Batched digests] in digest.cc).
// kFailedPrecondition for a device this build cannot hash on. A non-contiguous tensor (or one at an
// odd offset) is copied to a contiguous buffer that lives until the batch is done, so such tensors
// cost their size in device memory meanwhile.
absl::StatusOr<std::vector<std::string>> HashChunksOnDevices(absl::Span<const at::Tensor> tensors);

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_INTERNAL_CHUNK_HASH_DEVICE_H_
