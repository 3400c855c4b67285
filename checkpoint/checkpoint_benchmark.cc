// checkpoint benchmarks: an MLP block with dropout (hidden -> 4 x hidden -> hidden), one
// forward + backward step (64 tokens on CPU, 4096 on CUDA),
//   - plain (activations kept),
//   - checkpointed with RNG replay (StreamSnapshots: save, rewind, restore every step),
//   - checkpointed without RNG replay (a saver that saves nothing: the recompute cost alone),
//   - the RNG replay work alone (what a checkpoint adds per step: two saves, two restores),
//     timed in the same loop,
// on CPU with hidden 1024 (float32) and, in CUDA builds with a GPU, hidden 4096 (bfloat16).
// The three step modes alternate in one paired loop (each timed on its own, medians compared),
// after warm-up steps of every mode outside the timed region (CUDA context, allocator, autograd
// threads). Printed at the end: checkpointed with / without RNG replay (target: at most 1.01),
// the replay work's share of a step (target: at most 1%), and the bytes the checkpoint machinery
// retains after backward (target: 0). Exits 1 if a target figure could not be measured.

#include <chrono>
#include <iostream>
#include <memory>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/ratio_reporter.h"
#include "benchmark/benchmark.h"
#include "checkpoint/checkpoint.h"
#include "rng/rank_streams.h"

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
constexpr const char* kModeNames[] = {"plain", "with_rng", "without_rng"};

// One forward + backward step of `block` in `mode`; false if the checkpoint failed.
bool Step(Block& block, Mode mode, const CheckpointOptions& with_rng,
          const CheckpointOptions& without_rng) {
  auto fn = [&block](const std::vector<at::Tensor>& in) { return block.Forward(in); };
  block.ZeroGrad();
  std::vector<at::Tensor> out;
  if (mode == kPlain) {
    out = block.Forward({block.x});
  } else {
    absl::StatusOr<std::vector<at::Tensor>> checkpointed =
        Checkpoint(fn, {block.x}, mode == kWithRng ? with_rng : without_rng);
    if (!checkpointed.ok()) {
      std::cerr << "checkpoint_benchmark: " << checkpointed.status() << std::endl;
      return false;
    }
    out = *checkpointed;
  }
  out[0].backward(block.grad);
  Sync(block.cuda);
  return true;
}

// Plain, checkpointed with RNG replay and checkpointed without it, alternating in one loop.
void BM_StepPaired(benchmark::State& state) {
  const bool cuda = state.range(0) != 0;
  if (cuda && !HaveCuda()) {
    state.SkipWithError("no CUDA device: the CUDA step cannot be measured");
    return;
  }
  Block block(cuda);
  CheckpointOptions with_rng, without_rng;
  absl::StatusOr<std::shared_ptr<rng::RankStreams>> streams =
      rng::RankStreams::Create(block.generators);
  if (!streams.ok()) {
    state.SkipWithError(std::string(streams.status().message()).c_str());
    return;
  }
  with_rng.rng_streams = StreamSnapshots::Of(*streams);
  without_rng.rng_streams = std::make_shared<NoRngReplay>();
  for (int warm = 0; warm < 3; ++warm) {
    for (Mode mode : {kPlain, kWithRng, kWithoutRng}) {
      if (!Step(block, mode, with_rng, without_rng)) {
        state.SkipWithError("a warm-up step failed");
        return;
      }
    }
  }
  const RngStateSaver& saver = *with_rng.rng_streams;
  benchmarking::PairedSamples samples;
  for (auto _ : state) {
    {  // the RNG replay work alone: two saves and two restores, what a checkpoint adds per step
      const auto start = std::chrono::steady_clock::now();
      auto forward = saver.Save();
      auto live = saver.Save();
      if (!forward.ok() || !live.ok() || !(*forward)->Restore().ok() || !(*live)->Restore().ok()) {
        state.SkipWithError("the RNG replay work failed");
        return;
      }
      samples.Add("replay_work", std::chrono::duration<double, std::micro>(
                                     std::chrono::steady_clock::now() - start)
                                     .count());
    }
    for (Mode mode : {kPlain, kWithRng, kWithoutRng}) {
      const auto start = std::chrono::steady_clock::now();
      if (!Step(block, mode, with_rng, without_rng)) {
        state.SkipWithError("a step failed");
        return;
      }
      samples.Add(kModeNames[mode], std::chrono::duration<double, std::micro>(
                                        std::chrono::steady_clock::now() - start)
                                        .count());
    }
  }
  if (!samples.Publish(state)) return;
  state.counters["with_over_without"] = samples.Median("with_rng") / samples.Median("without_rng");
  state.counters["checkpointed_over_plain"] = samples.Median("with_rng") / samples.Median("plain");
  state.counters["replay_share"] = samples.Median("replay_work") / samples.Median("without_rng");
}

constexpr int kIterations = 12;
BENCHMARK(BM_StepPaired)
    ->ArgName("cuda")
    ->Arg(0)
#if LOCKSTEP_BUILT_WITH_CUDA
    // Only in CUDA builds: a CPU build has no CUDA step to measure (a CUDA build without a GPU
    // fails it, and exits 1).
    ->Arg(1)
#endif
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(kIterations);  // fixed, so every reported median has that many samples
}  // namespace
}  // namespace checkpoint
}  // namespace lockstep

int main(int argc, char** argv) {
  using lockstep::checkpoint::RetainedState;
  benchmark::Initialize(&argc, argv);
  lockstep::benchmarking::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  const bool cuda_present = lockstep::checkpoint::HaveCuda();
  for (int cuda : {0, 1}) {
    if (cuda && !cuda_present) continue;
    const std::string device = cuda ? "CUDA, hidden 4096 bf16" : "CPU, hidden 1024 f32";
    const std::string paired =
        absl::StrCat("BM_StepPaired/cuda:", cuda, "/iterations:", lockstep::checkpoint::kIterations,
                     "/real_time");
    reporter.PrintCounter(
        absl::StrCat("checkpointed step with RNG replay / without, paired medians (", device, ")"),
        paired, "with_over_without", 1.01);
    // Direct form of the 1% target: the replay work's share of a checkpointed step.
    reporter.PrintCounter(
        absl::StrCat("RNG replay work / checkpointed step, paired medians (", device, ")"), paired,
        "replay_share", 0.01);
  }
  const auto retained = RetainedState();
  std::cout << "retained after backward: " << retained.nodes << " checkpoint nodes, "
            << retained.rng_bytes << " RNG bytes (target: 0)" << std::endl;
  benchmark::Shutdown();
  return retained.nodes == 0 && retained.rng_bytes == 0 && reporter.all_measured() ? 0 : 1;
}
