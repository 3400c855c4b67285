// checkpoint benchmarks: an MLP block with dropout (hidden -> 4 x hidden -> hidden), one
// forward + backward step (64 tokens on CPU, 4096 on CUDA),
//   - plain (activations kept),
//   - checkpointed with RNG replay (StreamSnapshots: save, rewind, restore every step),
//   - checkpointed without RNG replay (a saver that saves nothing: the recompute cost alone),
//   - the RNG replay work alone (what a checkpoint adds per step: two saves, two restores),
// on CPU with hidden 1024 (float32) and, in CUDA builds with a GPU, hidden 4096 (bfloat16).
// Printed at the end: the cost of RNG replay relative to the checkpointed step (target: at most
// 1%), and the bytes the checkpoint machinery retains after backward (target: 0).

#include <iostream>
#include <memory>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/ratio_reporter.h"
#include "benchmark/benchmark.h"
#include "checkpoint/checkpoint.h"

#if LOCKSTEP_BUILT_WITH_CUDA
#include "c10/cuda/CUDAFunctions.h"
#include "torch/cuda.h"
#endif

namespace lockstep {
namespace checkpoint {
namespace {

class SavesNothing : public SavedRngState {
 public:
  absl::Status Restore() const override { return absl::OkStatus(); }
  size_t ByteSize() const override { return 0; }
};

class NoRngReplay : public RngStateSaver {
 public:
  absl::StatusOr<std::unique_ptr<SavedRngState>> Save() const override {
    return std::unique_ptr<SavedRngState>(new SavesNothing);
  }
};

bool HaveCuda() {
#if LOCKSTEP_BUILT_WITH_CUDA
  return c10::cuda::device_count() > 0;
#else
  return false;
#endif
}

void Sync(bool cuda) {
#if LOCKSTEP_BUILT_WITH_CUDA
  if (cuda) torch::cuda::synchronize();
#endif
}

struct Block {
  at::Tensor w1, w2, x, grad;
  bool cuda;
  rng::DefaultGenerators generators = rng::DefaultGenerators::CpuOnly();

  explicit Block(bool on_cuda) : cuda(on_cuda) {
    const int64_t hidden = cuda ? 4096 : 1024;
    const at::TensorOptions options =
        cuda ? at::TensorOptions().device(at::kCUDA, 0).dtype(at::kBFloat16)
             : at::TensorOptions().dtype(at::kFloat);
    at::manual_seed(1);
    w1 = (at::randn({hidden, 4 * hidden}, options) * 0.02).requires_grad_();
    w2 = (at::randn({4 * hidden, hidden}, options) * 0.02).requires_grad_();
    x = at::randn({cuda ? 4096 : 64, hidden}, options).requires_grad_();
    grad = at::ones({x.size(0), hidden}, options);
    generators =
        cuda ? rng::DefaultGenerators::WithCudaDevice(0) : rng::DefaultGenerators::CpuOnly();
  }
  std::vector<at::Tensor> Forward(const std::vector<at::Tensor>& in) const {
    at::Tensor h = at::dropout(at::gelu(at::matmul(in[0], w1)), 0.1, /*train=*/true);
    return {at::matmul(h, w2)};
  }
  void ZeroGrad() {
    for (at::Tensor* t : {&w1, &w2, &x}) t->mutable_grad() = at::Tensor();
  }
};

enum Mode { kPlain, kWithRng, kWithoutRng };

void BM_Step(benchmark::State& state) {
  const bool cuda = state.range(0) != 0;
  const Mode mode = static_cast<Mode>(state.range(1));
  if (cuda && !HaveCuda()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  Block block(cuda);
  auto fn = [&block](const std::vector<at::Tensor>& in) { return block.Forward(in); };
  CheckpointOptions options;
  if (mode == kWithRng)
    options.rng_streams = StreamSnapshots::DefaultGeneratorsOnly(block.generators);
  if (mode == kWithoutRng) options.rng_streams = std::make_shared<NoRngReplay>();
  for (auto _ : state) {
    block.ZeroGrad();
    std::vector<at::Tensor> out =
        mode == kPlain ? block.Forward({block.x}) : *Checkpoint(fn, {block.x}, options);
    out[0].backward(block.grad);
    Sync(cuda);
  }
}

void BM_RngReplayWork(benchmark::State& state) {
  const bool cuda = state.range(0) != 0;
  if (cuda && !HaveCuda()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  std::shared_ptr<StreamSnapshots> saver = StreamSnapshots::DefaultGeneratorsOnly(
      cuda ? rng::DefaultGenerators::WithCudaDevice(0) : rng::DefaultGenerators::CpuOnly());
  for (auto _ : state) {
    auto forward = saver->Save();  // in forward
    auto live = saver->Save();     // in backward, before the rewind
    benchmark::DoNotOptimize((*forward)->Restore());
    benchmark::DoNotOptimize((*live)->Restore());
  }
}

void StepArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"cuda", "mode"})->Unit(benchmark::kMillisecond)->UseRealTime();
  for (int cuda : {0, 1}) {
    for (int mode : {kPlain, kWithRng, kWithoutRng}) b->Args({cuda, mode});
  }
}
BENCHMARK(BM_Step)->Apply(StepArgs);
BENCHMARK(BM_RngReplayWork)
    ->ArgName("cuda")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace checkpoint
}  // namespace lockstep

int main(int argc, char** argv) {
  using lockstep::checkpoint::RetainedState;
  benchmark::Initialize(&argc, argv);
  lockstep::benchmarking::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  for (int cuda : {0, 1}) {
    const std::string device = cuda ? "CUDA, hidden 4096 bf16" : "CPU, hidden 1024 f32";
    const std::string step = absl::StrCat("BM_Step/cuda:", cuda, "/mode:");
    reporter.PrintRatio(absl::StrCat("checkpointed step with RNG replay / without (", device, ")"),
                        step + "1/real_time", step + "2/real_time", 1.01);
    reporter.PrintInfo(absl::StrCat("checkpointed step / plain step (", device, ")"),
                       step + "1/real_time", step + "0/real_time");
    // Direct form of the 1% target: the replay work's share of a checkpointed step.
    auto work = reporter.Seconds(absl::StrCat("BM_RngReplayWork/cuda:", cuda, "/real_time"));
    auto without = reporter.Seconds(step + "2/real_time");
    if (work.has_value() && without.has_value()) {
      lockstep::benchmarking::RatioReporter::PrintLine(
          absl::StrCat("RNG replay work / checkpointed step (", device, ")"),
          (*work * 1e-3) / *without, 0.01);  // microseconds over milliseconds
    }
  }
  const auto retained = RetainedState();
  std::cout << "retained after backward: " << retained.nodes << " checkpoint nodes, "
            << retained.rng_bytes << " RNG bytes (target: 0)" << std::endl;
  benchmark::Shutdown();
  return retained.nodes == 0 && retained.rng_bytes == 0 ? 0 : 1;
}
