// gpu: Checkpoint on the rank's CUDA generator — gradients bit-identical to the plain block,
// the aliasing negative control, and CUDA graph capture of a checkpointed dropout block
// (replay equals eager, again after later replays and after an eager checkpoint), plus the
// refusal path of a LibTorch without graph-safe generator state (selected by a switch).
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/cuda/CUDAGraph.h"
#include "absl/status/statusor.h"
#include "base/status_testutil.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"
#include "checkpoint/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rng/generators.h"
#include "rng/snapshot.h"
#include "torch/cuda.h"

namespace lockstep {
namespace checkpoint {
namespace {

const rng::DefaultGenerators kGpu = rng::DefaultGenerators::WithCudaDevice(0);
const at::TensorOptions kCuda = at::TensorOptions().device(at::kCUDA, 0);

using Fn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Tensors of one run of the block: parameters, input, and the gradient fed to backward.
struct Params {
  at::Tensor w1, w2, x, grad;
  static Params Make() {
    at::manual_seed(3);
    Params p;
    p.w1 = (at::randn({64, 256}, kCuda) * 0.1).requires_grad_();
    p.w2 = (at::randn({256, 64}, kCuda) * 0.1).requires_grad_();
    p.x = at::randn({32, 64}, kCuda).requires_grad_();
    p.grad = at::linspace(-1, 1, 32 * 64, kCuda).reshape({32, 64});
    return p;
  }
  Params Copy() const {
    Params p;
    p.w1 = w1.detach().clone().requires_grad_();
    p.w2 = w2.detach().clone().requires_grad_();
    p.x = x.detach().clone().requires_grad_();
    p.grad = grad;
    return p;
  }
};

Fn DropoutBlock(const Params& p) {
  return [p](const std::vector<at::Tensor>& in) {
    at::Tensor h = at::dropout(at::relu(at::matmul(in[0], p.w1)), 0.4, /*train=*/true);
    return std::vector<at::Tensor>{at::matmul(h, p.w2) + 0.01 * at::rand({32, 64}, kCuda)};
  };
}

Fn DeterministicBlock(const Params& p) {
  return [p](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{at::matmul(at::relu(at::matmul(in[0], p.w1)), p.w2)};
  };
}

// The first output of a checkpointed call, or its error.
absl::StatusOr<at::Tensor> FirstOutput(absl::StatusOr<std::vector<at::Tensor>> outputs) {
  if (!outputs.ok()) return outputs.status();
  return std::move(outputs->at(0));
}

struct Result {
  at::Tensor out, x_grad, w1_grad, w2_grad;
};

absl::StatusOr<Result> Step(Params p, bool checkpointed, const CheckpointOptions& options = {}) {
  Fn block = DropoutBlock(p);
  at::Tensor out;
  if (checkpointed) {
    absl::StatusOr<at::Tensor> first = FirstOutput(Checkpoint(block, {p.x}, options));
    if (!first.ok()) return first.status();
    out = *std::move(first);
  } else {
    out = block({p.x})[0];
  }
  (void)at::rand({16}, kCuda);  // the caller draws between forward and backward
  out.backward(p.grad);
  return Result{out.detach().cpu(), p.x.grad().cpu(), p.w1.grad().cpu(), p.w2.grad().cpu()};
}

bool Same(const Result& a, const Result& b) {
  return at::equal(a.out, b.out) && at::equal(a.x_grad, b.x_grad) &&
         at::equal(a.w1_grad, b.w1_grad) && at::equal(a.w2_grad, b.w2_grad);
}

TEST(CheckpointCudaTest, GradientsAndLiveGeneratorMatchThePlainBlock) {
  const Params p = Params::Make();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const rng::RngSnapshot start, rng::RngSnapshot::Capture(kGpu));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Result plain, Step(p.Copy(), false));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const rng::RngSnapshot plain_after,
                                rng::RngSnapshot::Capture(kGpu));
  ASSERT_TRUE(start.Restore().ok());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Result checkpointed, Step(p.Copy(), true));
  EXPECT_TRUE(Same(plain, checkpointed));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const rng::RngSnapshot after, rng::RngSnapshot::Capture(kGpu));
  EXPECT_EQ(after, plain_after);
  // The aliasing-snapshot negative control of this check is qualification_cuda_test (tools/).
  EXPECT_EQ(RetainedState().nodes, 0);
}

// Turns graph-safe generator state off for a scope (the refusal path of older LibTorch builds),
// and back on however the scope is left.
class WithoutGraphSafeState {
 public:
  WithoutGraphSafeState() { rng::internal::SetGraphSafeCudaStateEnabledForTesting(false); }
  ~WithoutGraphSafeState() { rng::internal::SetGraphSafeCudaStateEnabledForTesting(true); }
};

// The captured region: a checkpointed block (optionally with a nested checkpoint inside, so
// that snapshots are also taken while a rewound position is installed), a draw between forward
// and backward, and backward.
struct CapturedStep {
  at::Tensor out, between;
};

absl::StatusOr<CapturedStep> CheckpointedStep(const Params& p, bool nested) {
  Fn inner = [p](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{at::dropout(at::relu(at::matmul(in[0], p.w1)), 0.4, true)};
  };
  Fn block = [p, inner, nested](const std::vector<at::Tensor>& in) {
    at::Tensor h;
    if (nested) {
      // No ASSERT in a block: an error becomes an exception, which Checkpoint reports in
      // forward and backward rethrows, failing the test either way.
      absl::StatusOr<at::Tensor> first = FirstOutput(Checkpoint(inner, in));
      if (!first.ok()) throw std::runtime_error(first.status().ToString());
      h = *std::move(first);
    } else {
      h = inner(in)[0];
    }
    return std::vector<at::Tensor>{at::matmul(h, p.w2) + 0.01 * at::rand({32, 64}, kCuda)};
  };
  absl::StatusOr<std::vector<at::Tensor>> out = Checkpoint(block, {p.x});
  if (!out.ok()) return out.status();
  CapturedStep step{(*out)[0], at::rand({16}, kCuda)};
  step.out.backward(p.grad);
  return step;
}

CapturedStep PlainStep(const Params& p) {
  at::Tensor h = at::dropout(at::relu(at::matmul(p.x, p.w1)), 0.4, true);
  CapturedStep step{at::matmul(h, p.w2) + 0.01 * at::rand({32, 64}, kCuda), at::rand({16}, kCuda)};
  step.out.backward(p.grad);
  return step;
}

// Captures forward + backward of a checkpointed dropout block in one graph. Each replay must
// equal the plain block run eagerly from the generator state the replay started from.
void CaptureAndReplay(bool nested) {
  const Params captured = Params::Make();
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  {
    c10::cuda::CUDAStreamGuard guard(side);
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(CheckpointedStep(captured, nested).ok());  // warm-up
    for (at::Tensor t : {captured.w1, captured.w2, captured.x}) t.mutable_grad() = at::Tensor();
    torch::cuda::synchronize();
  }
  at::cuda::CUDAGraph graph;
  absl::StatusOr<CapturedStep> step;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    graph.capture_begin();
    step = CheckpointedStep(captured, nested);
    graph.capture_end();
  }
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(RetainedState().nodes, 0) << "backward in the graph released its state";

  auto replay_and_compare = [&](const char* when) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const rng::RngSnapshot before, rng::RngSnapshot::Capture(kGpu));
    graph.replay();
    torch::cuda::synchronize();
    const Result replayed{step->out.detach().cpu(), captured.x.grad().cpu(),
                          captured.w1.grad().cpu(), captured.w2.grad().cpu()};
    const at::Tensor replayed_between = step->between.cpu();
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const rng::RngSnapshot after_replay,
                                  rng::RngSnapshot::Capture(kGpu));
    ASSERT_TRUE(before.Restore().ok());
    Params eager = captured.Copy();
    const CapturedStep reference_step = PlainStep(eager);
    const Result reference{reference_step.out.detach().cpu(), eager.x.grad().cpu(),
                           eager.w1.grad().cpu(), eager.w2.grad().cpu()};
    EXPECT_TRUE(Same(replayed, reference)) << when;
    EXPECT_TRUE(at::equal(replayed_between, reference_step.between.cpu())) << when;
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const rng::RngSnapshot after_eager,
                                  rng::RngSnapshot::Capture(kGpu));
    EXPECT_EQ(after_eager, after_replay)
        << when << ": the graph advanced the generator unlike the eager block";
  };
  replay_and_compare("first replay");
  replay_and_compare("second replay");
  // An eager checkpoint in between leaves the generator where a replay expects it.
  LOCKSTEP_ASSERT_OK(Step(captured.Copy(), true));
  replay_and_compare("replay after an eager checkpoint");
}

TEST(CheckpointCudaTest, CapturedCheckpointReplaysLikeTheEagerPlainBlock) {
  CaptureAndReplay(false);
}

TEST(CheckpointCudaTest, CapturedNestedCheckpointReplaysLikeTheEagerPlainBlock) {
  CaptureAndReplay(true);
}

TEST(CheckpointCudaTest, WithoutGraphSafeStateStochasticCaptureIsRefusedDeterministicWorks) {
  WithoutGraphSafeState switch_off;
  const Params p = Params::Make();
  Fn stochastic = DropoutBlock(p);
  Fn deterministic = DeterministicBlock(p);
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  {
    c10::cuda::CUDAStreamGuard guard(side);
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor warm_up,
                                  FirstOutput(Checkpoint(deterministic, {p.x})));
    warm_up.backward(p.grad);  // warm-up
    for (at::Tensor t : {p.w1, p.w2, p.x}) t.mutable_grad() = at::Tensor();
    torch::cuda::synchronize();
  }
  absl::Status refused;
  absl::StatusOr<std::vector<at::Tensor>> accepted;
  at::Tensor out;
  bool backward_threw = false;
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    graph.capture_begin();
    refused = Checkpoint(stochastic, {p.x}).status();
    accepted = Checkpoint(deterministic, {p.x});
    if (accepted.ok()) {
      out = (*accepted)[0];
      (void)at::rand({16}, kCuda);  // a draw between forward and backward, outside the block
      try {
        out.backward(p.grad);
      } catch (const std::exception&) {
        backward_threw = true;
      }
    }
    graph.capture_end();
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("no graph-safe generator state"));
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  ASSERT_FALSE(backward_threw) << "a deterministic checkpoint failed in backward";
  graph.replay();
  torch::cuda::synchronize();
  Params eager = p.Copy();
  at::Tensor eager_out = DeterministicBlock(eager)({eager.x})[0];
  eager_out.backward(eager.grad);
  // Bit-identical, as Checkpoint promises.
  EXPECT_TRUE(at::equal(out.cpu(), eager_out.detach().cpu()));
  EXPECT_TRUE(at::equal(p.w1.grad().cpu(), eager.w1.grad().cpu()));
  EXPECT_EQ(RetainedState().nodes, 0);
}

// A recompute that throws inside a capture still puts the graph's own generator state back:
// after the capture ends, eager CUDA draws work and continue where the graph leaves them.
TEST(CheckpointCudaTest, RecomputeErrorInsideACaptureRestoresTheGraphsGeneratorState) {
  const Params p = Params::Make();
  int calls = 0;
  Fn block = [&](const std::vector<at::Tensor>& in) {
    at::Tensor h = at::dropout(at::relu(at::matmul(in[0], p.w1)), 0.4, true);
    if (++calls == 4) throw std::runtime_error("recompute failed on purpose");
    return std::vector<at::Tensor>{at::matmul(h, p.w2)};
  };
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  {
    c10::cuda::CUDAStreamGuard guard(side);
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor warm_up, FirstOutput(Checkpoint(block, {p.x})));
    warm_up.backward(p.grad);  // warm-up: calls 1 and 2
    torch::cuda::synchronize();
  }
  bool threw = false;
  absl::Status forward;
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    graph.capture_begin();
    absl::StatusOr<std::vector<at::Tensor>> out = Checkpoint(block, {p.x});  // call 3
    forward = out.status();
    if (out.ok()) {
      try {
        (*out)[0].backward(p.grad);  // call 4 throws
      } catch (const std::exception&) {
        threw = true;
      }
    }
    graph.capture_end();
  }
  ASSERT_TRUE(forward.ok()) << forward;
  EXPECT_TRUE(threw);
  EXPECT_EQ(RetainedState().nodes, 0);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const rng::RngSnapshot before, rng::RngSnapshot::Capture(kGpu));
  at::Tensor eager;
  EXPECT_NO_THROW(eager = at::rand({8}, kCuda)) << "a rewound capture-only state was left live";
  graph.replay();
  torch::cuda::synchronize();
  ASSERT_TRUE(before.Restore().ok());
  EXPECT_TRUE(at::equal(at::rand({8}, kCuda).cpu(), eager.cpu()));
}

// No input on CUDA, but the block draws on the current device: the default saver covers it.
TEST(CheckpointCudaTest, DefaultStreamsCoverTheCurrentDeviceWithoutCudaInputs) {
  at::Tensor scale = at::ones({64}).requires_grad_();  // a CPU input
  Fn block = [](const std::vector<at::Tensor>& in) {
    at::Tensor mask = at::dropout(at::ones({64}, kCuda), 0.5, true).cpu();
    return std::vector<at::Tensor>{in[0] * mask};
  };
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor out, FirstOutput(Checkpoint(block, {scale})));
  out.sum().backward();
  EXPECT_TRUE(at::equal(scale.grad(), out.detach())) << "recompute drew another CUDA mask";
}

}  // namespace
}  // namespace checkpoint
}  // namespace lockstep
