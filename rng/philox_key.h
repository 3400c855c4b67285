// rng/philox_key.h
//
// The value types of partition-invariant randomness (philox.h): the key a counter-based draw is
// made under, and the box of a global tensor a shard covers. Kept apart from philox.h so that
// the CUDA half (rng/internal/philox_cuda.h) can share them without depending on it.
//
// Thread-safety: values.

#ifndef LOCKSTEP_RNG_PHILOX_KEY_H_
#define LOCKSTEP_RNG_PHILOX_KEY_H_

#include <cstdint>

namespace lockstep {
namespace rng {

// What a partition-invariant draw is keyed by: equal keys give equal values, element for
// element, and keys that differ in any field give independent ones.
struct PhiloxKey {
  // The key of (seed, stream, step).
  static PhiloxKey Of(uint64_t seed, uint32_t stream, uint32_t step) {
    PhiloxKey key;
    key.seed = seed;
    key.stream = stream;
    key.step = step;
    return key;
  }

  uint64_t seed = 0;    // the run's seed: Philox's 64-bit key (low word, high word)
  uint32_t stream = 0;  // which use of randomness (attention dropout, token mask, ...)
  uint32_t step = 0;    // training step (or microbatch), so masks differ between steps
};

// One [begin, end) range of a dimension.
struct Slice {
  int64_t begin = 0;  // first index in the range
  int64_t end = 0;    // one past the last index; begin <= end (begin == end: empty)
};

}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_PHILOX_KEY_H_
