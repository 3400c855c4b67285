// rng benchmarks, with the ratios the rng issue sets targets for printed at the end:
//   - ModelStreamScope enter + exit (CPU generator; plus the rank's CUDA generator in
//     --config=cuda builds, which then run everything with device 0's generator too);
//   - one model-stream scope plus Synchronize, the per-microbatch RNG cost of a TP x CP rank;
//   - Synchronize over Gloo with 2 and 4 local processes against a bare broadcast of the same
//     number of bytes in the same run (target: ratio <= 1.2);
//   - partition-invariant dropout against torch's (at::native_dropout forward, and its backward,
//     the mask applied to a gradient) on the same tensor, paired in one loop with a copy of the
//     same bytes (the bandwidth reachable here): targets <= 1.0x on CUDA for 1M to 256M float32,
//     bfloat16 and float16 elements, forward and backward; <= 1.5x on CPU for 1M and 16M float32
//     forward (the CPU backward, a recompute of Philox against torch's read of a saved mask, is
//     printed for context).
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

// Dropout's element types, by benchmark argument.
at::ScalarType DropoutType(int64_t code) {
  switch (code) {
    case 1:
      return at::kBFloat16;
    case 2:
      return at::kHalf;
    default:
      return at::kFloat;
  }
}
const char* DropoutTypeName(int64_t code) {
  return code == 1 ? "bfloat16" : code == 2 ? "float16" : "float32";
}

// Partitioned dropout against torch's in one loop (paired), forward (at::native_dropout, which
// also writes its mask) or backward (at::native_dropout_backward: the mask applied to a
// gradient, against partitioned dropout of the gradient, which recomputes its mask), with a
// copy of the same bytes in the same loop: the memory's reachable bandwidth on this machine, so
// that "of_copy" is the fraction of it partitioned dropout achieves (it reads and writes each
// element once, as the copy does).
void DropoutPaired(benchmark::State& state, const at::TensorOptions& device) {
  const int64_t n = state.range(0);
  const at::TensorOptions options = device.dtype(DropoutType(state.range(1)));
  const bool backward = state.range(2) == 1;
  constexpr double kP = 0.1;
  at::Tensor x = at::randn({n}, options), copy = at::empty_like(x);
  auto sync = [&] {
#if LOCKSTEP_BUILT_WITH_CUDA
    if (options.device().is_cuda()) c10::cuda::device_synchronize();
#endif
  };
  auto [torch_out, mask] = at::native_dropout(x, kP, /*train=*/true);
  uint32_t step = 0;
  auto partitioned = [&]() -> bool {
    absl::StatusOr<at::Tensor> out = PartitionedDropout(x, {7, 0, step++}, {n}, {{0, n}}, kP);
    benchmark::DoNotOptimize(out);
    sync();
    return out.ok();
  };
  auto torch_dropout = [&] {
    if (backward) {
      benchmark::DoNotOptimize(at::native_dropout_backward(x, mask, 1.0 / (1.0 - kP)));
    } else {
      benchmark::DoNotOptimize(at::native_dropout(x, kP, /*train=*/true));
    }
    sync();
  };
  auto copy_bytes = [&] {
    copy.copy_(x);
    sync();
  };
  for (int warm = 0; warm < 3; ++warm) {  // first touches and kernel loads outside the timing
    torch_dropout();
    copy_bytes();
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
    copy_bytes();
    samples.Add("copy", micros(t0));
    t0 = std::chrono::steady_clock::now();
    if (!partitioned()) {
      state.SkipWithError("partitioned dropout failed");
      return;
    }
    samples.Add("partitioned", micros(t0));
  }
  if (!samples.Publish(state)) return;
  const double bytes = 2.0 * static_cast<double>(x.nbytes());
  state.counters["ratio"] = samples.Median("partitioned") / samples.Median("torch");
  state.counters["GBps"] = bytes / samples.Median("partitioned") / 1e3;
  state.counters["of_copy"] = samples.Median("copy") / samples.Median("partitioned");
}

constexpr int kDropoutIterations = 30;

void BM_DropoutPaired(benchmark::State& state) { DropoutPaired(state, at::TensorOptions()); }
// elements, dtype (0 float32), pass (0 forward, 1 backward)
BENCHMARK(BM_DropoutPaired)
    ->ArgsProduct({{1 << 20, 1 << 24}, {0}, {0, 1}})
    ->ArgNames({"elements", "dtype", "backward"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(kDropoutIterations);  // fixed: every reported median has that many samples

#if LOCKSTEP_BUILT_WITH_CUDA
constexpr int64_t kCudaDropoutSizes[] = {1 << 20, 1 << 24, 1 << 28};
void BM_DropoutPairedCuda(benchmark::State& state) {
  DropoutPaired(state, at::TensorOptions().device(at::kCUDA, 0));
}
BENCHMARK(BM_DropoutPairedCuda)
    ->ArgsProduct({{kCudaDropoutSizes[0], kCudaDropoutSizes[1], kCudaDropoutSizes[2]},
                   {0, 1, 2},
                   {0, 1}})
    ->ArgNames({"elements", "dtype", "backward"})
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
  // Dropout targets: <= 1.0x torch's on CUDA (every size, type and pass), <= 1.5x on CPU.
  // backward_target < 0: the backward ratio is printed for context, with no target.
  auto dropout_rows = [&](const std::string& bench, std::initializer_list<int64_t> sizes,
                          std::initializer_list<int> types, double target, double backward_target) {
    const bool on_cuda = bench == "BM_DropoutPairedCuda";
    for (int64_t n : sizes) {
      for (int type : types) {
        for (int backward : {0, 1}) {
          const std::string name =
              absl::StrCat(bench, "/elements:", n, "/dtype:", type, "/backward:", backward,
                           "/iterations:", kDropoutIterations, "/real_time");
          const std::string what =
              absl::StrCat("partitioned / torch dropout", on_cuda ? " on CUDA" : "", ", ", n, " ",
                           DropoutTypeName(type), backward ? ", backward" : ", forward");
          if (backward && backward_target < 0) {
            reporter.PrintCounterInfo(absl::StrCat(what,
                                                   " (no target: torch's backward reads "
                                                   "a saved mask, this one recomputes it)"),
                                      name, "ratio");
          } else {
            reporter.PrintCounter(what, name, "ratio", backward ? backward_target : target);
          }
          reporter.PrintCounterInfo("its share of a copy's bandwidth", name, "of_copy");
          reporter.PrintCounterInfo("its GB/s", name, "GBps");
        }
      }
    }
  };
#if LOCKSTEP_BUILT_WITH_CUDA
  dropout_rows("BM_DropoutPairedCuda",
               {kCudaDropoutSizes[0], kCudaDropoutSizes[1], kCudaDropoutSizes[2]}, {0, 1, 2}, 1.0,
               1.0);
#endif
  dropout_rows("BM_DropoutPaired", {1 << 20, 1 << 24}, {0}, 1.5, -1);
  benchmark::Shutdown();
  return reporter.all_measured() ? 0 : 1;
}
