// testing/process_world.h
//
// RunProcessWorld forks N processes, connects them into a Gloo world (over a FileStore in a
// fresh temporary directory, or a TCPStore on a free loopback port), runs a body in each and
// reports every rank's status back to the parent. Each rank is a real process with its own
// default generators, thread pools and global state, which is what tests of process-global
// contracts (default RNG synchronization, exact resume) need and threads cannot give.
//
// A rank that crashes, exits without reporting, or outlives the deadline is reported as an error
// for that rank (kAborted / kDeadlineExceeded, with its exit code or signal); the parent never
// hangs: stragglers are killed at the deadline.
//
// Precondition: call from a process that has not started LibTorch's intra-op threads (fork
// copies only the calling thread; OpenMP pools do not survive it). Test binaries that use this
// should do their LibTorch work inside the bodies.
//
// Example:
//   std::vector<absl::Status> results = collectives::RunProcessWorld(
//       collectives::ProcessWorldOptions::Of(4),
//       [](int rank, collectives::Communicator& world) -> absl::Status {
//         at::Tensor t = at::full({2}, rank);
//         return world.AllReduceSum(t);
//       });

#ifndef LOCKSTEP_TESTING_PROCESS_WORLD_H_
#define LOCKSTEP_TESTING_PROCESS_WORLD_H_

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"

namespace lockstep {
namespace collectives {

struct ProcessWorldOptions {
  // A world of `world_size` processes with the defaults below for the rest.
  static ProcessWorldOptions Of(int world_size) {
    ProcessWorldOptions options;
    options.world_size = world_size;
    return options;
  }

  // Number of processes. Must be positive.
  int world_size = 2;
  // Timeout of every collective and of the rendezvous. Default: 20 s.
  absl::Duration collective_timeout = absl::Seconds(20);
  // Gloo's own timeout inside each operation (GlooCommunicator::Options::engine_timeout; zero:
  // collective_timeout). Default: zero.
  absl::Duration engine_timeout = absl::ZeroDuration();
  // The whole run's limit; ranks still running then are killed. Default: 120 s.
  absl::Duration deadline = absl::Seconds(120);
  // Rendezvous over a TCPStore on 127.0.0.1 (true) or a FileStore (false, the default).
  bool tcp_store = false;
  // LibTorch intra-op threads per process. Default: 1, so N processes fit on a small machine.
  int intra_op_threads = 1;
};

using ProcessBody = std::function<absl::Status(int rank, collectives::Communicator& world)>;

// Runs `body` in `options.world_size` forked processes and returns each rank's status, indexed
// by rank. The returned status of a rank is its body's status, or the error that prevented the
// body from running or reporting.
std::vector<absl::Status> RunProcessWorld(const ProcessWorldOptions& options, ProcessBody body);

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_TESTING_PROCESS_WORLD_H_
