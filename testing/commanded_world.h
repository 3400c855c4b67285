// testing/commanded_world.h
//
// CommandedGlooWorlds (testonly, for benchmarks): Gloo worlds in which this process is rank 0 and
// the other ranks are forked peers that follow its commands. Built for benchmarks: Google Benchmark
// decides the iteration count on rank 0 only, so before each timed loop rank 0 sends (operation,
// payload bytes, iterations) and every peer runs exactly that many operations.
//
// Precondition: Start() runs before this process does any LibTorch work (fork copies only the
// calling thread). Peers run `op` until Stop().
//
// Thread-safety: one thread.
//
// Example:
//   CommandedGlooWorlds worlds(RunMyOp);  // RunMyOp(comm, op, payload) -> absl::Status
//   worlds.Start({2, 4});                 // forks 1 + 3 peers
//   // Then, in a benchmark of the world of size 2:
//   absl::Status commanded = worlds.Command(2, kBroadcast, bytes, state.max_iterations);
//   if (!commanded.ok()) state.SkipWithError(commanded.ToString().c_str());
//   for (auto _ : state) RunMyOp(*worlds.rank0(2), kBroadcast, payload);
//   // Finally (the destructor stops them too):
//   worlds.Stop();

#ifndef LOCKSTEP_TESTING_COMMANDED_WORLD_H_
#define LOCKSTEP_TESTING_COMMANDED_WORLD_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "base/subprocess.h"
#include "collectives/communicator.h"

namespace lockstep {
namespace collectives {

class CommandedGlooWorlds {
 public:
  // Runs operation `op` (>= 1; 0 means stop) once on `payload`.
  using Operation =
      std::function<absl::Status(collectives::Communicator& comm, int64_t op, at::Tensor& payload)>;

  explicit CommandedGlooWorlds(Operation operation) : operation_(std::move(operation)) {}
  ~CommandedGlooWorlds() { Stop(); }

  // Forks the peers of a world of each size, then joins rank 0 of each. Worlds that fail to
  // start have a null rank0().
  void Start(const std::vector<int>& sizes);

  // Rank 0's communicator of the world of `size`, or null.
  collectives::Communicator* rank0(int size);

  // Tells the peers of world `size` to run `op` on `bytes`-byte payloads `iterations` times.
  absl::Status Command(int size, int64_t op, int64_t bytes, int64_t iterations);

  // Stops and reaps every peer.
  void Stop();

 private:
  struct World {
    std::unique_ptr<collectives::Communicator> rank0;
    std::vector<Child> peers;
    std::string dir;  // the rendezvous store's directory, removed by Stop()
  };

  Operation operation_;
  std::map<int, World> worlds_;
};

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_TESTING_COMMANDED_WORLD_H_
