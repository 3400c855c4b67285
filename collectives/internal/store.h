// collectives/internal/store.h
//
// Private to collectives/: the c10d store behind a Rendezvous, for the communicator
// implementations that build their process groups on it. Includes c10d headers, so only
// implementation files include it.

#ifndef LOCKSTEP_COLLECTIVES_INTERNAL_STORE_H_
#define LOCKSTEP_COLLECTIVES_INTERNAL_STORE_H_

#include <chrono>

#include "absl/time/time.h"
#include "collectives/rendezvous.h"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace lockstep {
namespace collectives {

struct Rendezvous::Impl {
  c10::intrusive_ptr<c10d::Store> store;
};

namespace internal {

inline std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_INTERNAL_STORE_H_
