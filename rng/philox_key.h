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

struct PhiloxKey {
  static PhiloxKey Of(uint64_t seed, uint32_t stream, uint32_t step) {
    PhiloxKey key;
    key.seed = seed;
    key.stream = stream;
    key.step = step;
    return key;
  }

  uint64_t seed = 0;
  uint32_t stream = 0;  // which use of randomness (attention dropout, token mask, ...)
  uint32_t step = 0;    // training step (or microbatch), so masks differ between steps
};

// One [begin, end) range of a dimension.
struct Slice {
  int64_t begin = 0;
  int64_t end = 0;
};

}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_PHILOX_KEY_H_
