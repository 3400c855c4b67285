// rng/philox.h
//
// Partition-invariant randomness: a counter-based generator (Philox4x32-10, Salmon et al.,
// "Parallel random numbers: as easy as 1, 2, 3", SC'11) keyed by (seed, stream, step) and
// indexed by the *global* element index of the unsharded tensor. The value of element i depends
// only on the key and i, never on which rank computes it or how the tensor is split, so a
// dropout mask or random draw computed on a TP/CP shard equals the matching slice of the
// unsharded one — on any sharding: column or row splits, the 2 x CP zigzag chunks of
// load-balanced context parallelism, uneven and empty shards.
//
// Element i uses Philox block i / 4 with counter (block low 32 bits, block high 32 bits, step,
// stream) and key (seed low, seed high), and takes output word i % 4; its uniform is
// (word >> 8) * 2^-24, in [0, 1) with 24 random bits (float32's precision). Dropout keeps
// element i when its uniform >= p and scales kept values by 1 / (1 - p).
//
// A shard is described by a box: one [begin, end) range per dimension of the global shape.
//
// Thread-safety: stateless; safe from any thread. CPU tensors here; CUDA tensors in
// --config=cuda builds (the same values, bit for bit).
//
// Example (TP column split of a [tokens, hidden] activation):
//   rng::PhiloxKey key = rng::PhiloxKey::Of(seed, kAttentionDropout, step);
//   std::vector<rng::Slice> box = {{0, tokens}, {tp_rank * shard, (tp_rank + 1) * shard}};
//   LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor out,
//       rng::PartitionedDropout(local_activation, key, {tokens, hidden}, box, 0.1));

#ifndef LOCKSTEP_RNG_PHILOX_H_
#define LOCKSTEP_RNG_PHILOX_H_

#include <array>
#include <cstdint>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "rng/philox_key.h"

namespace lockstep {
namespace rng {

// The raw Philox4x32-10 bijection (exposed for known-answer tests).
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// Uniform [0, 1) float32 values of the box `box` of a global tensor of shape `global_shape`,
// as a tensor of the box's shape on `device`. kInvalidArgument names the dimension and the
// bound for a box that does not fit the shape.
absl::StatusOr<at::Tensor> PartitionedUniform(const PhiloxKey& key,
                                              absl::Span<const int64_t> global_shape,
                                              absl::Span<const Slice> box, c10::Device device);

// The dropout keep-mask (bool) of the box: true where the element is kept.
// kInvalidArgument unless 0 <= p < 1.
absl::StatusOr<at::Tensor> PartitionedDropoutMask(const PhiloxKey& key,
                                                  absl::Span<const int64_t> global_shape,
                                                  absl::Span<const Slice> box, double p,
                                                  c10::Device device);

// Dropout of `shard`, the box `box` of a global tensor of shape `global_shape`: kept elements
// scaled by 1 / (1 - p), others zero. `shard` must be contiguous, floating point, of the box's
// shape; the result has its dtype and device. It records no gradient: a shard that requires one
// under grad mode is refused (kFailedPrecondition) rather than having its gradient lost.
absl::StatusOr<at::Tensor> PartitionedDropout(const at::Tensor& shard, const PhiloxKey& key,
                                              absl::Span<const int64_t> global_shape,
                                              absl::Span<const Slice> box, double p);

}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_PHILOX_H_
