// collectives/internal/store_probe.h
//
// ProbeStore: the first contact with a c10d TCPStore at host:port, made over a plain socket so
// that every step of it is bounded by a deadline and nothing the peer sends can end the process
// (Note [Bounded start-up] in rendezvous.cc says why LibTorch's client cannot be trusted with it).
// Package-private: the rendezvous's ranks other than 0 call it before LibTorch's client connects.
//
// Thread-safety: stateless; calls are independent.

#ifndef LOCKSTEP_COLLECTIVES_INTERNAL_STORE_PROBE_H_
#define LOCKSTEP_COLLECTIVES_INTERNAL_STORE_PROBE_H_

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace lockstep {
namespace collectives {
namespace internal {

using Clock = std::chrono::steady_clock;

// Connects to host:port (retrying while nothing listens there yet, since rank 0 may start later
// than the caller) and checks that it answers one store query as a c10d TCPStore does, every
// step ending by `deadline` (`timeout` only names the bound in messages). OK when it does;
// kDeadlineExceeded when nothing accepts or what accepts never answers; kUnavailable when the
// connection is lost before any reply or `host` does not resolve; kFailedPrecondition ("...
// host:port did not answer as a c10d store") when something else answers.
absl::Status ProbeStore(const std::string& host, int port, absl::Duration timeout,
                        Clock::time_point deadline);

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_INTERNAL_STORE_PROBE_H_
