// rng benchmarks, with the ratios the rng issue sets targets for printed at the end:
//   - ModelStreamScope enter + exit (CPU generator; plus the rank's CUDA generator in
//     --config=cuda builds, which then run everything with device 0's generator too);
//   - one model-stream scope plus Synchronize, the per-microbatch RNG cost of a TP x CP rank;
//   - Synchronize over Gloo with 2 and 4 local processes against a bare broadcast of the same
//     number of bytes in the same run (target: ratio <= 1.2);
//   - partition-invariant dropout against at::dropout on the same tensor (target: <= 2x), paired
//     in one loop, on CPU and, in CUDA builds, on the GPU.
// Every ratio with a target comes from a paired loop; each timed loop runs after warm-up outside
// it; the binary exits 1 when a target figure could not be measured.
//
// This process is rank 0 of each Gloo world; peers are forked before any LibTorch work and
// follow rank 0's commands (operation, bytes, iterations), so every rank runs exactly the
// iterations the benchmark times.

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/ratio_reporter.h"
#include "benchmark/benchmark.h"
#include "rng/model_stream.h"
#include "rng/philox.h"
#include "rng/rank_streams.h"
#include "rng/snapshot.h"
#include "rng/synchronize.h"
#include "testing/commanded_world.h"

#if LOCKSTEP_BUILT_WITH_CUDA
#include "c10/cuda/CUDAFunctions.h"
#endif

namespace lockstep {
namespace rng {
namespace {

enum Op : int64_t {
  kStop = 0,
  kBareBroadcast = 1,
  kSynchronize = 2,
  kScopeAndSynchronize = 3,
  kPaired = 4,  // bare broadcast, Synchronize, scope + Synchronize: one of each per iteration
};

// The rank's generators: the CPU one, and device 0's CUDA generator in CUDA builds.
const DefaultGenerators kGenerators =
    LOCKSTEP_BUILT_WITH_CUDA ? DefaultGenerators::WithCudaDevice(0) : DefaultGenerators::CpuOnly();

// The rank's streams (created on first use, after the peers are forked), or why they could not
// be created.
absl::StatusOr<RankStreams*> Streams() {
  static const auto* streams =
      new absl::StatusOr<std::shared_ptr<RankStreams>>(RankStreams::Create(kGenerators));
  if (!streams->ok()) return streams->status();
  return streams->value().get();
}

// One model-stream scope, entered and left.
absl::Status ScopeOnce() {
  absl::StatusOr<RankStreams*> streams = Streams();
  if (!streams.ok()) return streams.status();
  absl::StatusOr<ModelStreamScope> scope = ModelStreamScope::Enter(**streams);
  if (!scope.ok()) return scope.status();
  return scope->Exit();
}

// The bytes Synchronize moves.
int64_t StateBytes() { return static_cast<int64_t>(SynchronizeWireBytes(kGenerators)); }

absl::Status RunOp(collectives::Communicator& comm, Op op, at::Tensor& payload) {
  if (op == kBareBroadcast) return comm.Broadcast(payload, 0);
  absl::StatusOr<RankStreams*> streams = Streams();
  if (!streams.ok()) return streams.status();
  if (op == kPaired) {
    if (absl::Status s = comm.Broadcast(payload, 0); !s.ok()) return s;
    if (absl::Status s = Synchronize(&comm, **streams); !s.ok()) return s;
    if (absl::Status s = ScopeOnce(); !s.ok()) return s;
    return Synchronize(&comm, **streams);
  }
  if (op == kScopeAndSynchronize) {
    if (absl::Status s = ScopeOnce(); !s.ok()) return s;
  }
  return Synchronize(&comm, **streams);
}

collectives::CommandedGlooWorlds& Worlds() {
  static auto* worlds = new collectives::CommandedGlooWorlds(
      [](collectives::Communicator& comm, int64_t op, at::Tensor& payload) {
        return RunOp(comm, static_cast<Op>(op), payload);
      });
  return *worlds;
}

void BM_ModelStreamScope(benchmark::State& state) {
  absl::StatusOr<RankStreams*> created = Streams();
  if (!created.ok()) {
    state.SkipWithError(std::string(created.status().message()).c_str());
    return;
  }
  RankStreams& streams = **created;
  // The first scope derives the model stream, and in CUDA builds the first CUDA generator access
  // creates the device's context: both outside the timed loop.
  for (int warm = 0; warm < 10; ++warm) {
    if (!ScopeOnce().ok()) {
      state.SkipWithError("entering or leaving the model stream failed");
      return;
    }
  }
  for (auto _ : state) {
    absl::StatusOr<ModelStreamScope> scope = ModelStreamScope::Enter(streams);
    if (!scope.ok() || !scope->Exit().ok()) {
      state.SkipWithError("entering or leaving the model stream failed");
      return;
    }
  }
}
BENCHMARK(BM_ModelStreamScope)->Unit(benchmark::kMicrosecond)->Iterations(20000);

void BM_Gloo(benchmark::State& state, Op op) {
  const int size = static_cast<int>(state.range(0));
  const int64_t bytes = StateBytes();
  absl::Status commanded =
      Worlds().Command(size, op, bytes, static_cast<int64_t>(state.max_iterations));
  if (!commanded.ok()) {
    state.SkipWithError(std::string(commanded.message()).c_str());
    return;
  }
  collectives::Communicator* comm = Worlds().rank0(size);
  at::Tensor payload = at::zeros({bytes}, at::kByte);
  for (auto _ : state) {
    if (!RunOp(*comm, op, payload).ok()) {
      state.SkipWithError("collective failed");
      break;
    }
  }
  state.counters["bytes"] = static_cast<double>(bytes);
}
// 2 and 4 processes, real time in microseconds.
void GlooArgs(benchmark::internal::Benchmark* b) {
  b->Arg(2)->Arg(4)->ArgName("procs")->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK_CAPTURE(BM_Gloo, bare_broadcast, kBareBroadcast)->Apply(GlooArgs);
BENCHMARK_CAPTURE(BM_Gloo, synchronize, kSynchronize)->Apply(GlooArgs);
// One model-stream scope (enter + exit) plus Synchronize: the RNG cost per hand-back point.
BENCHMARK_CAPTURE(BM_Gloo, scope_and_synchronize, kScopeAndSynchronize)->Apply(GlooArgs);

// Bare broadcast, Synchronize, and a model-stream scope plus Synchronize (the anchor's "RNG scope
// plus TP x CP synchronization") alternate within one loop, each timed on its own, so that all
// see the same machine state; the medians resist the scheduler's outliers. The ratio of the
// first two medians is the figure the 1.2x target is judged on.
void BM_GlooPaired(benchmark::State& state) {
  const int size = static_cast<int>(state.range(0));
  const int64_t bytes = StateBytes();
  collectives::Communicator* comm = Worlds().rank0(size);
  if (comm == nullptr) {
    state.SkipWithError("the Gloo world did not start");
    return;
  }
  at::Tensor payload = at::zeros({bytes}, at::kByte);
  // Warm-up rounds (connections, first allocations), run by the peers too, outside the timing.
  constexpr int kWarmup = 20;
  if (absl::Status s = Worlds().Command(size, kPaired, bytes, kWarmup); !s.ok()) {
    state.SkipWithError(std::string(s.message()).c_str());
    return;
  }
  for (int i = 0; i < kWarmup; ++i) {
    if (absl::Status s = RunOp(*comm, kPaired, payload); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
  }
  absl::Status commanded =
      Worlds().Command(size, kPaired, bytes, static_cast<int64_t>(state.max_iterations));
  if (!commanded.ok()) {
    state.SkipWithError(std::string(commanded.message()).c_str());
    return;
  }
  absl::StatusOr<RankStreams*> streams = Streams();  // created by the warm-up already
  if (!streams.ok()) {
    state.SkipWithError(std::string(streams.status().message()).c_str());
    return;
  }
  benchmarking::PairedSamples samples;
  auto micros = [](auto from, auto to) {
    return std::chrono::duration<double, std::micro>(to - from).count();
  };
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status b = comm->Broadcast(payload, 0);
    const auto t1 = std::chrono::steady_clock::now();
    absl::Status s = b.ok() ? Synchronize(comm, **streams) : b;
    const auto t2 = std::chrono::steady_clock::now();
    absl::Status scoped = s.ok() ? ScopeOnce() : s;
    absl::Status ss = scoped.ok() ? Synchronize(comm, **streams) : scoped;
    const auto t3 = std::chrono::steady_clock::now();
    if (!ss.ok()) {
      state.SkipWithError(std::string(ss.message()).c_str());
      return;
    }
    samples.Add("bare", micros(t0, t1));
    samples.Add("sync", micros(t1, t2));
    samples.Add("scope_sync", micros(t2, t3));
  }
  if (!samples.Publish(state)) return;
  state.counters["ratio"] = samples.Median("sync") / samples.Median("bare");
}
constexpr int kGlooIterations = 1000;
BENCHMARK(BM_GlooPaired)->Apply(GlooArgs)->Iterations(kGlooIterations);

// at::dropout and partitioned dropout of the same tensor, alternating in one loop (paired).
void DropoutPaired(benchmark::State& state, const at::TensorOptions& options) {
  const int64_t n = state.range(0);
  at::Tensor x = at::randn({n}, options);
  auto sync = [&] {
#if LOCKSTEP_BUILT_WITH_CUDA
    if (options.device().is_cuda()) c10::cuda::device_synchronize();
#endif
  };
  uint32_t step = 0;
  auto partitioned = [&]() -> bool {
    absl::StatusOr<at::Tensor> out = PartitionedDropout(x, {7, 0, step++}, {n}, {{0, n}}, 0.1);
    benchmark::DoNotOptimize(out);
    sync();
    return out.ok();
  };
  auto torch_dropout = [&] {
    benchmark::DoNotOptimize(at::dropout(x, 0.1, /*train=*/true));
    sync();
  };
  for (int warm = 0; warm < 3; ++warm) {  // first touches and kernel loads outside the timing
    torch_dropout();
    if (!partitioned()) {
      state.SkipWithError("partitioned dropout failed");
      return;
    }
  }
  benchmarking::PairedSamples samples;
  auto micros = [](auto from) {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - from)
        .count();
  };
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    torch_dropout();
    samples.Add("torch", micros(t0));
    t0 = std::chrono::steady_clock::now();
    if (!partitioned()) {
      state.SkipWithError("partitioned dropout failed");
      return;
    }
    samples.Add("partitioned", micros(t0));
  }
  if (!samples.Publish(state)) return;
  state.counters["ratio"] = samples.Median("partitioned") / samples.Median("torch");
}

constexpr int kDropoutIterations = 30;

void BM_DropoutPaired(benchmark::State& state) { DropoutPaired(state, at::TensorOptions()); }
BENCHMARK(BM_DropoutPaired)
    ->Arg(1 << 20)
    ->Arg(1 << 24)
    ->ArgName("elements")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(kDropoutIterations);  // fixed: every reported median has that many samples

#if LOCKSTEP_BUILT_WITH_CUDA
void BM_DropoutPairedCuda(benchmark::State& state) {
  DropoutPaired(state, at::TensorOptions().device(at::kCUDA, 0));
}
BENCHMARK(BM_DropoutPairedCuda)
    ->Arg(1 << 24)
    ->ArgName("elements")
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->Iterations(kDropoutIterations);  // fixed: every reported median has that many samples
#endif

}  // namespace
}  // namespace rng
}  // namespace lockstep

int main(int argc, char** argv) {
  using namespace lockstep::rng;
  benchmark::Initialize(&argc, argv);
  // Forks the peers before this process does any LibTorch work.
  Worlds().Start({2, 4});
  lockstep::benchmarking::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  Worlds().Stop();
  for (int procs : {2, 4}) {
    reporter.PrintCounter(
        absl::StrCat("synchronize / bare broadcast, ", procs, " procs, paired medians"),
        absl::StrCat("BM_GlooPaired/procs:", procs, "/iterations:", kGlooIterations, "/real_time"),
        "ratio", 1.2);
    reporter.PrintInfo(
        absl::StrCat("synchronize / bare broadcast, ", procs, " procs, separate runs"),
        absl::StrCat("BM_Gloo/synchronize/procs:", procs, "/real_time"),
        absl::StrCat("BM_Gloo/bare_broadcast/procs:", procs, "/real_time"));
  }
#if LOCKSTEP_BUILT_WITH_CUDA
  reporter.PrintCounter("partitioned dropout / torch dropout on CUDA, 16777216 elements, paired",
                        absl::StrCat("BM_DropoutPairedCuda/elements:16777216/iterations:",
                                     kDropoutIterations, "/real_time"),
                        "ratio", 2.0);
#endif
  for (const char* n : {"1048576", "16777216"}) {
    reporter.PrintCounter(
        absl::StrCat("partitioned dropout / torch dropout, ", n, " elements, paired medians"),
        absl::StrCat("BM_DropoutPaired/elements:", n, "/iterations:", kDropoutIterations,
                     "/real_time"),
        "ratio", 2.0);
  }
  benchmark::Shutdown();
  return reporter.all_measured() ? 0 : 1;
}
