// The operator recorder's cost (numerics/op_recorder.h): a transformer training step (pre-norm
// attention and MLP blocks over `tokens` rows of `width`, a loss, backward) run plain and with
// every one of its ATen calls recorded (inputs and outputs digested on the step's device, lines
// written to a file), the two alternating in one loop and timed each on its own; the recorded
// step includes its Flush (every pending digest computed and written) and a device
// synchronization, so nothing of its cost is left outside the timed region. Counters: ratio
// (recorded / plain, medians), calls (operator calls recorded per step) and calls_per_s (calls
// recorded per second of recorded step). Target: at most 2x the plain step on the H200 at the
// large size; the other sizes and the CPU are printed for context. A CUDA build without a GPU
// exits 1: it cannot measure what it is for.

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/ratio_reporter.h"
#include "benchmark/benchmark.h"
#include "numerics/op_recorder.h"
#if LOCKSTEP_BUILT_WITH_CUDA
#include "ATen/cuda/CUDAContext.h"
#endif

namespace lockstep {
namespace numerics {
namespace {

void Synchronize(at::Device device) {
#if LOCKSTEP_BUILT_WITH_CUDA
  if (device.is_cuda()) at::cuda::getCurrentCUDAStream().synchronize();
#else
  (void)device;
#endif
}

// A model of `blocks` blocks, each attention (wq, wk, wv, wo) and an MLP of 4 x width.
struct Model {
  std::vector<at::Tensor> weights;
  at::Tensor x;

  Model(int64_t tokens, int64_t width, int64_t blocks, at::Device device) {
    at::manual_seed(3);
    const auto options = at::TensorOptions().device(device);
    const double scale = 1.0 / std::sqrt(static_cast<double>(width));
    for (int64_t b = 0; b < blocks; ++b) {
      for (int w = 0; w < 4; ++w) {
        weights.push_back((at::randn({width, width}, options) * scale).set_requires_grad(true));
      }
      weights.push_back((at::randn({4 * width, width}, options) * scale).set_requires_grad(true));
      weights.push_back(
          (at::randn({width, 4 * width}, options) * scale * 0.5).set_requires_grad(true));
    }
    x = at::randn({tokens, width}, options);
  }

  void Step() {
    for (at::Tensor& w : weights) w.mutable_grad() = at::Tensor();
    const int64_t width = x.size(1);
    const at::Tensor causal =
        at::ones({x.size(0), x.size(0)}, x.options().dtype(at::kBool)).triu(1);
    at::Tensor h = x;
    for (size_t b = 0; b < weights.size(); b += 6) {
      const at::Tensor n1 = at::layer_norm(h, {width});
      const at::Tensor q = at::mm(n1, weights[b].t());
      const at::Tensor k = at::mm(n1, weights[b + 1].t());
      const at::Tensor v = at::mm(n1, weights[b + 2].t());
      const at::Tensor scores =
          (at::mm(q, k.t()) / std::sqrt(static_cast<double>(width))).masked_fill(causal, -1e9);
      h = h + at::mm(at::mm(at::softmax(scores, 1), v), weights[b + 3].t());
      const at::Tensor n2 = at::layer_norm(h, {width});
      h = h + at::mm(at::gelu(at::mm(n2, weights[b + 4].t())), weights[b + 5].t());
    }
    h.pow(2).mean().backward();
  }
};

void BM_StepPaired(benchmark::State& state, at::Device device) {
  const int64_t tokens = state.range(0), width = state.range(1), blocks = state.range(2);
  Model model(tokens, width, blocks, device);
  const std::string path =
      absl::StrCat(std::getenv("TEST_TMPDIR") != nullptr ? std::getenv("TEST_TMPDIR") : "/tmp",
                   "/op_recorder_benchmark.", getpid(), ".jsonl");
  absl::StatusOr<std::unique_ptr<OperatorRecorder>> recorder = OperatorRecorder::Create(path);
  if (!recorder.ok()) {
    state.SkipWithError(std::string(recorder.status().message()).c_str());
    return;
  }
  auto recorded_step = [&]() -> absl::Status {
    {
      OperatorRecorder::Scope scope(**recorder, "step");
      model.Step();
    }
    absl::Status flushed = (*recorder)->Flush();
    Synchronize(device);
    return flushed;
  };
  // Warm-up outside the timed loop: kernels loaded, the allocator's pools filled, both sides.
  model.Step();
  Synchronize(device);
  if (absl::Status s = recorded_step(); !s.ok()) {
    state.SkipWithError(std::string(s.message()).c_str());
    return;
  }
  benchmarking::PairedSamples samples;
  int64_t calls = 0;
  auto seconds = [](auto from) {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - from)
        .count();
  };
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    model.Step();
    Synchronize(device);
    samples.Add("plain", seconds(t0));
    const int64_t before = (*recorder)->recorded();
    t0 = std::chrono::steady_clock::now();
    if (absl::Status s = recorded_step(); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
    samples.Add("recorded", seconds(t0));
    calls = (*recorder)->recorded() - before;
  }
  absl::Status closed = (*recorder)->Close();
  std::remove(path.c_str());
  if (!closed.ok()) {
    state.SkipWithError(std::string(closed.message()).c_str());
    return;
  }
  if (!samples.Publish(state)) return;
  state.counters["ratio"] = samples.Median("recorded") / samples.Median("plain");
  state.counters["calls"] = static_cast<double>(calls);
  state.counters["calls_per_s"] = static_cast<double>(calls) / (samples.Median("recorded") * 1e-6);
}

void Sizes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"tokens", "width", "blocks"});
  b->Args({256, 256, 2});
}

#if LOCKSTEP_BUILT_WITH_CUDA
void LargeSizes(benchmark::internal::Benchmark* b) {
  Sizes(b);
  b->Args({4096, 2048, 4});
}
#endif

constexpr int kIterations = 12;

BENCHMARK_CAPTURE(BM_StepPaired, cpu, at::Device(at::kCPU))
    ->Apply(Sizes)
    ->Iterations(kIterations)
    ->UseRealTime();
#if LOCKSTEP_BUILT_WITH_CUDA
BENCHMARK_CAPTURE(BM_StepPaired, cuda, at::Device(at::kCUDA, 0))
    ->Apply(LargeSizes)
    ->Iterations(kIterations)
    ->UseRealTime();
#endif

}  // namespace
}  // namespace numerics
}  // namespace lockstep

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
#if LOCKSTEP_BUILT_WITH_CUDA
  if (!at::hasCUDA()) {
    std::fprintf(stderr, "op_recorder_benchmark: a CUDA build with no GPU cannot measure\n");
    return 1;
  }
#endif
  lockstep::benchmarking::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  const std::string suffix =
      absl::StrCat("/iterations:", lockstep::numerics::kIterations, "/real_time");
  for (const char* device : {"cpu", "cuda"}) {
    const std::string small =
        absl::StrCat("BM_StepPaired/", device, "/tokens:256/width:256/blocks:2", suffix);
    reporter.PrintCounterInfo(absl::StrCat("recorded / plain step, ", device, ", small"), small,
                              "ratio");
    reporter.PrintCounterInfo(absl::StrCat("calls recorded per second, ", device, ", small"), small,
                              "calls_per_s");
  }
#if LOCKSTEP_BUILT_WITH_CUDA
  const std::string large =
      absl::StrCat("BM_StepPaired/cuda/tokens:4096/width:2048/blocks:4", suffix);
  reporter.PrintCounter("recorded / plain step, cuda, 4096 x 2048 x 4 blocks, paired medians",
                        large, "ratio", 2.0);
  reporter.PrintCounterInfo("calls recorded per second, cuda, large", large, "calls_per_s");
#endif
  return reporter.all_measured() ? 0 : 1;
}
