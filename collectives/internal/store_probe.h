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
#include "absl/status/statusor.h"
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

// Note [The store's address]: c10d's TCPStore server listens on every interface, whatever
// MASTER_ADDR says, so a store meant for 127.0.0.1 is reachable from the network. Where LibTorch
// lets the server take over a socket (TCPStoreOptions::masterListenFd, LibTorch 2.4 and later),
// rank 0 binds one to MASTER_ADDR when it is a numeric address, and the store listens there
// only. kUnavailable for a host name (it may resolve on rank 0's machine to an address the other
// nodes do not use) or an address this machine cannot listen on: the caller then lets the store
// listen as LibTorch does.
// Whether this build's LibTorch takes a listening socket for its store.
bool StoreTakesASocket();
// A socket bound to host:port and listening, for the store to take over (see above).
absl::StatusOr<int> ListenOnStoreAddress(const std::string& host, int port);

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_INTERNAL_STORE_PROBE_H_
