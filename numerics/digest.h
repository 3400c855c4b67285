// numerics/digest.h
//
// The lockstep state digest, version 1 (numerics/DIGEST.md defines it byte for byte;
// numerics/digest_reference.py is a second implementation): a 128-bit XXH3 digest per tensor
// over its dtype, shape and logical contiguous bytes, hashed in 16 KiB chunks in parallel, and
// one over a set of named tensor digests in name order. Independent of memory layout, device and
// registration order; sensitive to every bit, name, dtype and shape.
//
// Thread-safety: stateless functions (CPU chunks are hashed on LibTorch's intra-op threads).
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(numerics::Digest128 d, numerics::DigestTensor(weight));
//   std::cout << numerics::DigestHex128(d);

#ifndef LOCKSTEP_NUMERICS_DIGEST_H_
#define LOCKSTEP_NUMERICS_DIGEST_H_

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace lockstep {
namespace numerics {

// XXH3-128 in canonical form: the high 64 bits big-endian, then the low 64 bits big-endian.
using Digest128 = std::array<uint8_t, 16>;

// C, the chunk size in bytes (DIGEST.md step 2): a tensor's bytes are hashed in chunks of 16 KiB,
// the last one padded with zero bytes.
inline constexpr size_t kDigestChunkBytes = 16384;

// The 32 lowercase hex digits of a digest.
std::string DigestHex128(const Digest128& digest);

// H(bytes): XXH3-128, seed 0, default secret, canonical form.
Digest128 Xxh3Digest(absl::string_view bytes);

// The chunk hashes of `bytes` (DIGEST.md step 2), into `out` (16 bytes per chunk), on the CPU.
void HashChunks(absl::string_view bytes, uint8_t* out);

// The tensor digest from its parts: the safetensors dtype name, the shape, and the chunk hashes
// (DIGEST.md step 3).
Digest128 TensorRecordDigest(absl::string_view dtype_name, absl::Span<const int64_t> shape,
                             uint64_t num_bytes, absl::string_view chunk_hashes);

// The digest of logical contiguous `bytes` of a tensor of `dtype_name` and `shape`.
Digest128 TensorBytesDigest(absl::string_view dtype_name, absl::Span<const int64_t> shape,
                            absl::string_view bytes);

// The digest of a tensor on the CPU or (in CUDA builds) a CUDA device, whose chunks are then
// hashed on the device and only their hashes copied back. kInvalidArgument for an undefined
// tensor or a dtype without a safetensors name; kFailedPrecondition for a device this build
// cannot hash on.
absl::StatusOr<Digest128> DigestTensor(const at::Tensor& tensor);

// DigestTensor of each tensor, computed together (Note [Batched digests] in digest.cc): a state
// of many small tensors is hashed at the speed of its bytes, not of its tensor count. The same
// errors as DigestTensor, naming the tensor's index.
absl::StatusOr<std::vector<Digest128>> DigestTensors(absl::Span<const at::Tensor> tensors);

// The state digest of named tensor digests (DIGEST.md, "A state"); names must be unique
// (kInvalidArgument naming a duplicate).
absl::StatusOr<Digest128> StateDigest(std::vector<std::pair<std::string, Digest128>> named);

}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_DIGEST_H_
