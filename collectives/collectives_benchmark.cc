// Latency of broadcast and all-gather for payloads from 16 B to 64 KiB, on the in-process fake
// (threads) and on Gloo with 2 and 4 local processes. These are the baselines that the RNG
// synchronization overhead of later modules is measured against.
//
// This process is rank 0 of each Gloo world; the other ranks are forked before any LibTorch
// work and follow rank 0's commands: before each timed loop rank 0 broadcasts (operation,
// payload bytes, iterations), so every rank runs exactly the iterations the benchmark times.
// Exits 1 if a run could not measure (a collective failed).

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/ratio_reporter.h"
#include "benchmark/benchmark.h"
#include "testing/commanded_world.h"
#include "testing/fake_communicator.h"

namespace lockstep {
namespace collectives {
namespace {

enum Op : int64_t { kStop = 0, kBroadcast = 1, kAllGather = 2 };

absl::Status RunOp(Communicator& comm, Op op, at::Tensor& payload) {
  if (op == kBroadcast) return comm.Broadcast(payload, 0);
  return comm.AllGather(payload).status();
}

collectives::CommandedGlooWorlds& Worlds() {
  static auto* worlds =
      new collectives::CommandedGlooWorlds([](Communicator& comm, int64_t op, at::Tensor& payload) {
        return RunOp(comm, static_cast<Op>(op), payload);
      });
  return *worlds;
}

void BM_Gloo(benchmark::State& state, Op op) {
  const int size = static_cast<int>(state.range(0));
  const int64_t bytes = state.range(1);
  absl::Status commanded =
      Worlds().Command(size, op, bytes, static_cast<int64_t>(state.max_iterations));
  if (!commanded.ok()) {
    state.SkipWithError(std::string(commanded.message()).c_str());
    return;
  }
  Communicator* comm = Worlds().rank0(size);
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
  collectives::FakeWorld world(size);
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
  benchmark::Initialize(&argc, argv);
  // Forks the peers before this process does any LibTorch work.
  lockstep::collectives::Worlds().Start({2, 4});
  lockstep::benchmarking::RatioReporter reporter;  // counts runs that could not measure
  benchmark::RunSpecifiedBenchmarks(&reporter);
  lockstep::collectives::Worlds().Stop();
  benchmark::Shutdown();
  return reporter.all_measured() ? 0 : 1;
}
