// Checkpoint: recompute replays the forward's randomness (gradients bit-identical to the plain
// block for every stream arrangement), leaves live streams untouched, releases its state with
// backward, and refuses what it cannot do. The aliasing saver is the negative control.
#include "checkpoint/checkpoint.h"

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/statusor.h"
#include "base/status_testutil.h"
#include "base/torch_boundary.h"
#include "c10/util/Exception.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rng/generators.h"
#include "rng/rank_streams.h"
#include "rng/snapshot.h"
#include "torch/csrc/autograd/autograd.h"

namespace lockstep {
namespace checkpoint {
namespace {

const rng::DefaultGenerators kCpu = rng::DefaultGenerators::CpuOnly();

absl::StatusOr<std::shared_ptr<rng::RankStreams>> Streams() {
  return rng::RankStreams::Create(kCpu);
}

// The first output of a checkpointed call, or its error.
absl::StatusOr<at::Tensor> FirstOutput(absl::StatusOr<std::vector<at::Tensor>> outputs) {
  if (!outputs.ok()) return outputs.status();
  return std::move(outputs->at(0));
}

// A two-layer MLP block with dropout and an additive random draw: every call draws.
struct Mlp {
  at::Tensor w1, w2;
  Mlp() {
    at::manual_seed(11);
    w1 = (at::randn({16, 32}) * 0.2).requires_grad_();
    w2 = (at::randn({32, 8}) * 0.2).requires_grad_();
  }
  at::Tensor Forward(const at::Tensor& x) const {
    at::Tensor h = at::dropout(at::relu(at::matmul(x, w1)), 0.3, /*train=*/true);
    return at::matmul(h, w2) + 0.01 * at::rand({x.size(0), 8});
  }
  void ZeroGrad() {
    w1.mutable_grad() = at::Tensor();
    w2.mutable_grad() = at::Tensor();
  }
};

using Block = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

struct Step {
  std::vector<at::Tensor> outputs;
  at::Tensor x_grad, w1_grad, w2_grad;
  at::Tensor drawn_between;  // what the caller drew between forward and backward
  std::optional<rng::RngSnapshot> after;
};

at::Tensor LossWeights(const at::Tensor& out) {
  return at::linspace(-1.0, 2.0, out.numel()).reshape(out.sizes());
}

// Seeds, draws the input, runs `block` plainly or checkpointed, draws between forward and
// backward, backpropagates a weighted sum of every output.
Step RunStep(Mlp& mlp, const Block& block, bool checkpointed, uint64_t seed,
             const CheckpointOptions& options = {}, bool input_requires_grad = true) {
  mlp.ZeroGrad();
  at::manual_seed(seed);
  at::Tensor x = at::randn({4, 16});
  if (input_requires_grad) x.requires_grad_();
  Step step;
  if (checkpointed) {
    absl::StatusOr<std::vector<at::Tensor>> out = Checkpoint(block, {x}, options);
    if (!out.ok()) {
      ADD_FAILURE() << out.status();
      return step;
    }
    step.outputs = *out;
  } else {
    step.outputs = block({x});
  }
  step.drawn_between = at::rand({4});
  at::Tensor loss = at::zeros({});
  for (const at::Tensor& out : step.outputs) loss = loss + (out * LossWeights(out)).sum();
  loss.backward();
  if (input_requires_grad) step.x_grad = x.grad().clone();
  step.w1_grad = mlp.w1.grad().clone();
  step.w2_grad = mlp.w2.grad().clone();
  absl::StatusOr<rng::RngSnapshot> after = rng::RngSnapshot::Capture(kCpu);
  if (!after.ok()) {
    ADD_FAILURE() << after.status();
    return step;
  }
  step.after = *std::move(after);
  return step;
}

void ExpectBitIdentical(const Step& plain, const Step& checkpointed) {
  // A step that failed (reported where it failed) has no snapshot: nothing to compare.
  ASSERT_TRUE(plain.after.has_value() && checkpointed.after.has_value()) << "a step failed";
  ASSERT_EQ(plain.outputs.size(), checkpointed.outputs.size());
  for (size_t i = 0; i < plain.outputs.size(); ++i) {
    EXPECT_TRUE(at::equal(plain.outputs[i], checkpointed.outputs[i])) << "output " << i;
  }
  if (plain.x_grad.defined()) {
    EXPECT_TRUE(at::equal(plain.x_grad, checkpointed.x_grad)) << "input gradient differs";
  }
  EXPECT_TRUE(at::equal(plain.w1_grad, checkpointed.w1_grad)) << "w1 gradient differs";
  EXPECT_TRUE(at::equal(plain.w2_grad, checkpointed.w2_grad)) << "w2 gradient differs";
  EXPECT_TRUE(at::equal(plain.drawn_between, checkpointed.drawn_between))
      << "the caller's draw between forward and backward moved";
  EXPECT_EQ(*plain.after, *checkpointed.after) << "live generator after backward differs";
}

Block MlpBlock(const Mlp& mlp) {
  return [&mlp](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{mlp.Forward(in[0])};
  };
}

TEST(CheckpointTest, DefaultStreamGradientsAreBitIdenticalToThePlainBlock) {
  Mlp mlp;
  Block block = MlpBlock(mlp);
  const Step plain = RunStep(mlp, block, false, 5);
  const Step checkpointed = RunStep(mlp, block, true, 5);
  ExpectBitIdentical(plain, checkpointed);
}

TEST(CheckpointTest, TwoConsecutiveStepsMatchThePlainBlock) {
  Mlp mlp;
  Block block = MlpBlock(mlp);
  std::vector<Step> plain, checkpointed;
  for (bool use_checkpoint : {false, true}) {
    mlp.ZeroGrad();
    at::manual_seed(8);
    at::Tensor x = at::randn({4, 16}).requires_grad_();
    std::vector<Step>& steps = use_checkpoint ? checkpointed : plain;
    for (int i = 0; i < 2; ++i) {
      Step step;
      if (use_checkpoint) {
        LOCKSTEP_ASSERT_OK_AND_ASSIGN(step.outputs, Checkpoint(block, {x}));
      } else {
        step.outputs = block({x});
      }
      (step.outputs[0] * LossWeights(step.outputs[0])).sum().backward();
      step.w1_grad = mlp.w1.grad().clone();  // accumulated over the steps
      step.x_grad = x.grad().clone();
      step.w2_grad = mlp.w2.grad().clone();
      step.drawn_between = at::rand({2});
      LOCKSTEP_ASSERT_OK_AND_ASSIGN(step.after, rng::RngSnapshot::Capture(kCpu));
      steps.push_back(step);
    }
  }
  EXPECT_FALSE(at::equal(plain[0].outputs[0], plain[1].outputs[0])) << "steps must draw anew";
  for (int i = 0; i < 2; ++i) ExpectBitIdentical(plain[i], checkpointed[i]);
}

TEST(CheckpointTest, NamedAndDefaultStreamsSharingOneGeneratorReplay) {
  Mlp mlp;
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<rng::RankStreams> streams, Streams());
  rng::NamedStreamTracker& tracker = streams->named();
  // Two names and the default stream, all drawing through the one CPU generator.
  Block block = [&](const std::vector<at::Tensor>& in) {
    at::Tensor h;
    {
      auto fork = tracker.Fork("tensor-parallel");
      h = at::dropout(at::relu(at::matmul(in[0], mlp.w1)), 0.3, true);
    }
    {
      auto fork = tracker.Fork("expert");
      h = h * at::bernoulli(at::full_like(h, 0.9));
    }
    return std::vector<at::Tensor>{at::matmul(h, mlp.w2) + 0.01 * at::rand({in[0].size(0), 8})};
  };
  auto run = [&](bool checkpointed, std::vector<std::string> names) {
    EXPECT_TRUE(tracker.Reset().ok());
    EXPECT_TRUE(tracker.Add("tensor-parallel", 1234).ok());
    EXPECT_TRUE(tracker.Add("expert", 99).ok());
    CheckpointOptions options;
    options.rng_streams = StreamSnapshots::Of(streams, names);
    Step step = RunStep(mlp, block, checkpointed, 21, options);
    return std::make_pair(step, tracker.Snapshot());
  };
  const auto [plain, plain_named] = run(false, {});
  const auto [all, all_named] = run(true, {});
  const auto [chosen, chosen_named] = run(true, {"tensor-parallel", "expert"});
  ExpectBitIdentical(plain, all);
  ExpectBitIdentical(plain, chosen);
  for (const auto& named : {all_named, chosen_named}) {
    ASSERT_EQ(named.size(), plain_named.size());
    for (const auto& [name, stream] : plain_named) {
      EXPECT_EQ(named.at(name).state, stream.state) << "named stream " << name << " moved";
    }
  }
}

TEST(CheckpointTest, OnlyTheNamedStreamsAskedForAreRewound) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<rng::RankStreams> streams, Streams());
  rng::NamedStreamTracker& tracker = streams->named();
  ASSERT_TRUE(tracker.Add("tensor-parallel", 1234).ok());
  ASSERT_TRUE(tracker.Add("expert", 99).ok());
  std::vector<at::Tensor> masks;  // the block's mask in forward, then in recompute
  Block block = [&](const std::vector<at::Tensor>& in) {
    auto fork = tracker.Fork("expert");
    at::Tensor mask = at::bernoulli(at::full_like(in[0], 0.5));
    masks.push_back(mask.detach().clone());
    return std::vector<at::Tensor>{in[0] * mask * 2.0};
  };
  CheckpointOptions options;
  options.rng_streams = StreamSnapshots::Of(streams, {"tensor-parallel"});
  at::Tensor x = at::ones({64}).requires_grad_();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor out, FirstOutput(Checkpoint(block, {x}, options)));
  out.sum().backward();
  // "expert" was not saved, so the recompute drew the stream's next mask, not the forward's:
  // the gradient is exactly the recompute mask's.
  ASSERT_EQ(masks.size(), 2u);
  EXPECT_FALSE(at::equal(masks[0], masks[1]));
  EXPECT_TRUE(at::equal(x.grad(), masks[1] * 2.0));
  EXPECT_TRUE(at::equal(out.detach(), masks[0] * 2.0));

  CheckpointOptions unknown;
  unknown.rng_streams = StreamSnapshots::Of(streams, {"nope"});
  absl::StatusOr<std::vector<at::Tensor>> refused = Checkpoint(block, {x}, unknown);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound) << refused.status();
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("'nope'"));
}

// A named stream saved in forward and removed before backward: the recompute cannot rewind it,
// so backward fails naming it, and the live streams are left as they were.
TEST(CheckpointTest, ANamedStreamRemovedBeforeBackwardIsNamed) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<rng::RankStreams> streams, Streams());
  ASSERT_TRUE(streams->named().Add("expert", 5).ok());
  Block block = [&](const std::vector<at::Tensor>& in) {
    auto fork = streams->named().Fork("expert");
    return std::vector<at::Tensor>{at::dropout(in[0], 0.5, true)};
  };
  CheckpointOptions options;
  options.rng_streams = StreamSnapshots::Of(streams);
  at::Tensor x = at::ones({16}).requires_grad_();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::vector<at::Tensor> out, Checkpoint(block, {x}, options));
  ASSERT_TRUE(streams->named().Reset().ok());
  ASSERT_TRUE(streams->named().Add("other", 6).ok());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const rng::RngSnapshot live, rng::RngSnapshot::Capture(kCpu));
  try {
    out[0].sum().backward();
    ADD_FAILURE() << "backward rewound a stream that no longer exists";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("named RNG stream 'expert' was removed"));
  }
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const rng::RngSnapshot after, rng::RngSnapshot::Capture(kCpu));
  EXPECT_EQ(after, live);
  EXPECT_TRUE(streams->named().Has("other"));
}

TEST(CheckpointTest, NestedCheckpointsMatchThePlainBlock) {
  Mlp mlp;
  Block inner = [&](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{at::dropout(at::relu(at::matmul(in[0], mlp.w1)), 0.3, true)};
  };
  Block plain_block = [&](const std::vector<at::Tensor>& in) {
    at::Tensor h = inner(in)[0];
    return std::vector<at::Tensor>{at::matmul(h, mlp.w2) + 0.01 * at::rand({in[0].size(0), 8})};
  };
  Block nested_block = [&](const std::vector<at::Tensor>& in) {
    // No ASSERT in a block: an error becomes an exception, which Checkpoint reports in forward
    // and backward rethrows, failing the test either way.
    absl::StatusOr<std::vector<at::Tensor>> inner_out = Checkpoint(inner, in);
    if (!inner_out.ok()) throw std::runtime_error(inner_out.status().ToString());
    at::Tensor h = (*inner_out)[0];
    return std::vector<at::Tensor>{at::matmul(h, mlp.w2) + 0.01 * at::rand({in[0].size(0), 8})};
  };
  const Step plain = RunStep(mlp, plain_block, false, 3);
  const Step nested = RunStep(mlp, nested_block, true, 3);
  ExpectBitIdentical(plain, nested);
}

TEST(CheckpointTest, NonTensorArgumentsTupleOutputsAndInputsWithoutGrad) {
  Mlp mlp;
  const double scale = 1.5;
  const int repeats = 2;
  Block block = [&](const std::vector<at::Tensor>& in) {
    at::Tensor h = at::dropout(at::matmul(in[0], mlp.w1), 0.2, true) * scale;
    at::Tensor counts = at::full({1}, repeats, at::kLong);  // not differentiable
    return std::vector<at::Tensor>{at::matmul(h, mlp.w2), h.sum(1) * repeats, counts, in[0]};
  };
  const Step plain = RunStep(mlp, block, false, 17, {}, /*input_requires_grad=*/false);
  const Step checkpointed = RunStep(mlp, block, true, 17, {}, /*input_requires_grad=*/false);
  ExpectBitIdentical(plain, checkpointed);
  EXPECT_TRUE(checkpointed.outputs[0].requires_grad());
  EXPECT_EQ(checkpointed.outputs[2].scalar_type(), at::kLong);
}

TEST(CheckpointTest, InsideAModelStreamScopeRecomputeSeesTheModelStream) {
  Mlp mlp;
  Block block = MlpBlock(mlp);
  auto run = [&](bool checkpointed, Step& step) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<rng::RankStreams> model, Streams());
    mlp.ZeroGrad();
    at::manual_seed(40);
    at::Tensor x = at::randn({4, 16}).requires_grad_();
    std::vector<at::Tensor> out;
    {
      auto scope = rng::ModelStreamScope::Enter(*model);
      ASSERT_TRUE(scope.ok()) << scope.status();
      if (checkpointed) {
        LOCKSTEP_ASSERT_OK_AND_ASSIGN(out, Checkpoint(block, {x}));
      } else {
        out = block({x});
      }
    }
    step.outputs = out;
    step.drawn_between = at::rand({3});               // the caller's stream
    (out[0] * LossWeights(out[0])).sum().backward();  // outside the scope
    step.x_grad = x.grad().clone();
    step.w1_grad = mlp.w1.grad().clone();
    step.w2_grad = mlp.w2.grad().clone();
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(step.after, rng::RngSnapshot::Capture(kCpu));
  };
  Step plain, checkpointed;
  ASSERT_NO_FATAL_FAILURE(run(false, plain));
  ASSERT_NO_FATAL_FAILURE(run(true, checkpointed));
  ExpectBitIdentical(plain, checkpointed);
}

TEST(CheckpointTest, NothingIsRetainedAfterBackwardEvenWhileTheOutputIsKept) {
  ASSERT_EQ(RetainedState().nodes, 0);
  Mlp mlp;
  Block block = MlpBlock(mlp);
  at::Tensor x = at::randn({4, 16}).requires_grad_();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor kept, FirstOutput(Checkpoint(block, {x})));
  EXPECT_EQ(RetainedState().nodes, 1);
  EXPECT_GT(RetainedState().rng_bytes, 0);
  kept.sum().backward();
  EXPECT_TRUE(kept.defined());
  EXPECT_EQ(RetainedState().nodes, 0);
  EXPECT_EQ(RetainedState().rng_bytes, 0);

  // A graph freed without backward releases its state too.
  { LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor dropped, FirstOutput(Checkpoint(block, {x}))); }
  EXPECT_EQ(RetainedState().nodes, 0);
  EXPECT_EQ(RetainedState().rng_bytes, 0);
}

TEST(CheckpointTest, SecondBackwardThroughAFreedGraphIsRefused) {
  Mlp mlp;
  Block block = MlpBlock(mlp);
  at::Tensor x = at::randn({4, 16}).requires_grad_();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor out, FirstOutput(Checkpoint(block, {x})));
  at::Tensor grad = at::ones_like(out);
  out.backward(grad);
  try {
    out.backward(grad);
    FAIL() << "second backward was accepted";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("released by an earlier backward"));
  }
}

TEST(CheckpointTest, RetainedGraphReplaysTheSameMaskOnASecondBackward) {
  Mlp mlp;
  Block block = MlpBlock(mlp);
  at::Tensor x = at::randn({4, 16}).requires_grad_();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor out, FirstOutput(Checkpoint(block, {x})));
  at::Tensor grad = LossWeights(out);
  out.backward(grad, /*retain_graph=*/true);
  at::Tensor once = mlp.w1.grad().clone();
  EXPECT_EQ(RetainedState().nodes, 1);
  out.backward(grad);
  EXPECT_TRUE(at::equal(mlp.w1.grad(), once * 2));
  EXPECT_EQ(RetainedState().nodes, 0);
}

TEST(CheckpointTest, ReturnedParametersAndViewsGetHistoryOnCopies) {
  Mlp mlp;
  Block block = [&](const std::vector<at::Tensor>& in) {
    at::Tensor h = at::dropout(at::matmul(in[0], mlp.w1), 0.2, true);
    return std::vector<at::Tensor>{h.view({-1}), mlp.w2, h.select(0, 1)};
  };
  const Step plain = RunStep(mlp, block, false, 9);
  const Step checkpointed = RunStep(mlp, block, true, 9);
  ExpectBitIdentical(plain, checkpointed);
  EXPECT_TRUE(mlp.w2.is_leaf()) << "a returned parameter must not get the checkpoint's history";
  EXPECT_EQ(mlp.w2.grad_fn(), nullptr);
}

TEST(CheckpointTest, HigherOrderGradientsAreRefused) {
  Mlp mlp;
  at::Tensor x = at::randn({4, 16}).requires_grad_();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor out, FirstOutput(Checkpoint(MlpBlock(mlp), {x})));
  try {
    (void)torch::autograd::grad({out.sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
    FAIL() << "create_graph=true was accepted";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("create_graph=true"));
  }
}

TEST(CheckpointTest, RecomputeThatThrowsRestoresTheLiveStreams) {
  int calls = 0;
  Block block = [&](const std::vector<at::Tensor>& in) {
    at::Tensor masked = at::dropout(in[0], 0.5, true);
    if (++calls == 2) throw std::runtime_error("recompute failed on purpose");
    return std::vector<at::Tensor>{masked};
  };
  at::Tensor x = at::ones({32}).requires_grad_();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor out, FirstOutput(Checkpoint(block, {x})));
  (void)at::rand({5});
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const rng::RngSnapshot before_backward,
                                rng::RngSnapshot::Capture(kCpu));
  EXPECT_THROW(out.sum().backward(), std::exception);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const rng::RngSnapshot after_backward,
                                rng::RngSnapshot::Capture(kCpu));
  EXPECT_EQ(after_backward, before_backward);
}

TEST(CheckpointTest, ForwardErrorsComeBackAsStatusAndRetainNothing) {
  Block block = [](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{at::matmul(in[0], at::ones({3, 3}))};  // shape mismatch
  };
  absl::StatusOr<std::vector<at::Tensor>> out =
      Checkpoint(block, {at::ones({2, 5}).requires_grad_()});
  EXPECT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(), ::testing::HasSubstr("running the checkpointed function"));
  EXPECT_EQ(RetainedState().nodes, 0);
  EXPECT_EQ(Checkpoint(nullptr, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

// A saver whose saved state cannot be written back: out of memory, as a device allocation would.
class OutOfMemoryOnRestore : public RngStateSaver {
 public:
  absl::StatusOr<std::unique_ptr<SavedRngState>> Save() const override {
    class Saved : public SavedRngState {
     public:
      absl::Status Restore() const override {
        return absl::ResourceExhaustedError("no memory left to restore the streams");
      }
      size_t ByteSize() const override { return 0; }
    };
    return std::unique_ptr<SavedRngState>(new Saved());
  }
};

// Backward reports by throwing; the exception's type keeps the status's code, so the caller's
// boundary sees out of memory as kResourceExhausted (what admission recovers from), not kInternal.
TEST(CheckpointTest, OutOfMemoryInBackwardStaysResourceExhausted) {
  CheckpointOptions options;
  options.rng_streams = std::make_shared<OutOfMemoryOnRestore>();
  Block block = [](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{in[0] * 2};
  };
  at::Tensor x = at::ones({4}).requires_grad_();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor out, FirstOutput(Checkpoint(block, {x}, options)));
  const absl::Status backward = CallTorch("backward", [&] { out.sum().backward(); });
  EXPECT_EQ(backward.code(), absl::StatusCode::kResourceExhausted) << backward;
  EXPECT_THAT(backward.message(), ::testing::HasSubstr("no memory left to restore the streams"));
}

}  // namespace
}  // namespace checkpoint
}  // namespace lockstep
