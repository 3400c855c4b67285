// Latency of broadcast and all-gather for payloads from 16 B to 64 KiB, on the in-process fake
// (threads) and on Gloo with 2 and 4 local processes. These are the baselines that the RNG
// synchronization overhead of later modules is measured against.
//
// This process is rank 0 of each Gloo world; the other ranks are forked before any LibTorch
// work and follow rank 0's commands: before each timed loop rank 0 broadcasts (operation,
// payload bytes, iterations), so every rank runs exactly the iterations the benchmark times.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "collectives/gloo_communicator.h"
#include "collectives/rendezvous.h"
#include "testing/fake_communicator.h"

namespace lockstep {
namespace collectives {
namespace {

enum Op : int64_t { kStop = 0, kBroadcast = 1, kAllGather = 2 };

absl::Status RunOp(Communicator& comm, Op op, at::Tensor& payload) {
  if (op == kBroadcast) return comm.Broadcast(payload, 0);
  return comm.AllGather(payload).status();
}

// Rank 0's communicator and the forked peers of one Gloo world.
struct GlooWorld {
  std::unique_ptr<GlooCommunicator> rank0;
  std::vector<pid_t> peers;
};

std::map<int, GlooWorld>& Worlds() {
  static auto* worlds = new std::map<int, GlooWorld>();
  return *worlds;
}

std::unique_ptr<GlooCommunicator> Join(const std::string& path, int rank, int size) {
  auto rendezvous = Rendezvous::File(path, rank, size, absl::Seconds(60));
  if (!rendezvous.ok()) {
    std::cerr << "rank " << rank << ": " << rendezvous.status() << "\n";
    return nullptr;
  }
  GlooCommunicator::Options options;
  options.hostname = "127.0.0.1";
  auto comm = GlooCommunicator::Create(*rendezvous, options);
  if (!comm.ok()) {
    std::cerr << "rank " << rank << ": " << comm.status() << "\n";
    return nullptr;
  }
  return std::move(*comm);
}

// A peer: follows commands until told to stop.
[[noreturn]] void PeerMain(const std::string& path, int rank, int size) {
  at::set_num_threads(1);
  std::unique_ptr<GlooCommunicator> comm = Join(path, rank, size);
  if (comm == nullptr) _exit(1);
  for (;;) {
    at::Tensor command = at::zeros({3}, at::kLong);
    if (!comm->Broadcast(command, 0).ok()) _exit(1);
    const Op op = static_cast<Op>(command[0].item<int64_t>());
    if (op == kStop) _exit(0);
    at::Tensor payload = at::zeros({command[1].item<int64_t>()}, at::kByte);
    for (int64_t i = 0, n = command[2].item<int64_t>(); i < n; ++i) {
      if (!RunOp(*comm, op, payload).ok()) _exit(1);
    }
  }
}

void StopGlooWorlds() {
  for (auto& [size, world] : Worlds()) {
    if (world.rank0 != nullptr) {
      at::Tensor command = at::zeros({3}, at::kLong);
      (void)world.rank0->Broadcast(command, 0);
    }
    for (pid_t pid : world.peers) waitpid(pid, nullptr, 0);
  }
}

void BM_Gloo(benchmark::State& state, Op op) {
  const int size = static_cast<int>(state.range(0));
  const int64_t bytes = state.range(1);
  GlooCommunicator* comm = Worlds()[size].rank0.get();
  if (comm == nullptr) {
    state.SkipWithError("Gloo world did not start");
    return;
  }
  at::Tensor command = at::tensor(
      {static_cast<int64_t>(op), bytes, static_cast<int64_t>(state.max_iterations)}, at::kLong);
  if (!comm->Broadcast(command, 0).ok()) {
    state.SkipWithError("command broadcast failed");
    return;
  }
  at::Tensor payload = at::zeros({bytes}, at::kByte);
  for (auto _ : state) {
    absl::Status status = RunOp(*comm, op, payload);
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

void BM_Fake(benchmark::State& state, Op op) {
  const int size = static_cast<int>(state.range(0));
  const int64_t bytes = state.range(1);
  testing::FakeWorld world(size);
  const int64_t iterations = static_cast<int64_t>(state.max_iterations);
  std::vector<std::thread> peers;
  for (int rank = 1; rank < size; ++rank) {
    peers.emplace_back([&world, rank, op, bytes, iterations] {
      auto comm = world.Communicator(rank);
      at::Tensor payload = at::zeros({bytes}, at::kByte);
      for (int64_t i = 0; i < iterations; ++i) {
        if (!RunOp(*comm, op, payload).ok()) return;
      }
    });
  }
  auto comm = world.Communicator(0);
  at::Tensor payload = at::zeros({bytes}, at::kByte);
  for (auto _ : state) {
    absl::Status status = RunOp(*comm, op, payload);
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      break;
    }
  }
  for (std::thread& t : peers) t.join();
  state.SetBytesProcessed(state.iterations() * bytes);
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (int world : {2, 4}) {
    for (int64_t bytes : {16, 256, 4096, 65536}) b->Args({world, bytes});
  }
  b->ArgNames({"ranks", "bytes"})->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK_CAPTURE(BM_Fake, broadcast, kBroadcast)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Fake, all_gather, kAllGather)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Gloo, broadcast, kBroadcast)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Gloo, all_gather, kAllGather)->Apply(Sizes);

}  // namespace
}  // namespace collectives
}  // namespace lockstep

int main(int argc, char** argv) {
  using namespace lockstep::collectives;
  benchmark::Initialize(&argc, argv);
  // Fork the peers before this process does any LibTorch work.
  std::map<int, std::string> paths;
  for (int size : {2, 4}) {
    char dir[] = "/tmp/lockstep_bench.XXXXXX";
    if (mkdtemp(dir) == nullptr) return 1;
    paths[size] = std::string(dir) + "/store";
    GlooWorld& world = Worlds()[size];
    for (int rank = 1; rank < size; ++rank) {
      const pid_t pid = fork();
      if (pid == 0) PeerMain(paths[size], rank, size);
      world.peers.push_back(pid);
    }
  }
  at::set_num_threads(1);
  for (int size : {2, 4}) Worlds()[size].rank0 = Join(paths[size], 0, size);
  benchmark::RunSpecifiedBenchmarks();
  StopGlooWorlds();
  benchmark::Shutdown();
  return 0;
}
