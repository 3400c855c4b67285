// collectives/internal/store.h
//
// Private to collectives/: the c10d store behind a Rendezvous, and the mapping of c10d/Gloo
// error messages to status codes. Includes c10d headers, so only communicator implementations
// include it.

#ifndef LOCKSTEP_COLLECTIVES_INTERNAL_STORE_H_
#define LOCKSTEP_COLLECTIVES_INTERNAL_STORE_H_

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
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

// Status for an exception message from c10d or Gloo: timeouts -> kDeadlineExceeded, closed or
// reset connections -> kUnavailable, anything else -> kInternal. `what` says what was attempted.
absl::Status CommunicationError(absl::string_view what, absl::string_view message);

// Runs `fn`, mapping exceptions through CommunicationError.
template <typename Fn>
absl::Status RunComm(absl::string_view what, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return CommunicationError(what, e.what());
  } catch (...) {
    return CommunicationError(what, "unknown exception");
  }
}

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_INTERNAL_STORE_H_
