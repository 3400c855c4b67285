#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/rng_state_saver.h"
#include "qualification/internal/checks.h"
#include "qualification/negative_controls.h"

namespace lockstep {
namespace qualification {
using internal::DisagreeWithLeader;
using internal::Rewind;
namespace {

// One step of an MLP block with dropout from the synchronized state, plainly and checkpointed;
// the block records the dropout mask of every call (forward, then recompute).
struct RecomputeStep {
  std::vector<at::Tensor> masks;
  at::Tensor x_grad, w1_grad, w2_grad, drawn_between;
  // A pointer, not an optional: GCC 12 at -O2 reports a moved optional<RngSnapshot> as maybe
  // uninitialized.
  std::shared_ptr<const rng::RngSnapshot> after;
};

absl::StatusOr<RecomputeStep> RunRecomputeStep(const RankSetup& setup, bool checkpointed,
                                               const checkpoint::CheckpointOptions& options) {
  RecomputeStep step;
  at::Tensor w1, w2, x;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("making the block's parameters", [&] {
    at::manual_seed(4242);  // the same parameters on every rank
    w1 = (at::randn({32, 64}) * 0.2).requires_grad_();
    w2 = (at::randn({64, 16}) * 0.2).requires_grad_();
  }));
  LOCKSTEP_RETURN_IF_ERROR(Rewind(setup));
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("drawing the input", [&] {
    x = at::randn({8, 32}).requires_grad_();
  }));
  auto block = [&](const std::vector<at::Tensor>& in) {
    at::Tensor h = at::relu(at::matmul(in[0], w1));
    at::Tensor mask = at::bernoulli(at::full_like(h, 0.7));
    step.masks.push_back(mask.detach().clone());
    return std::vector<at::Tensor>{at::matmul(h * mask / 0.7, w2)};
  };
  at::Tensor out;
  if (checkpointed) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> outs,
                              checkpoint::Checkpoint(block, {x}, options));
    out = outs[0];
  } else {
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("running the plain block", [&] { out = block({x})[0]; }));
  }
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("backward of the recompute check", [&] {
    step.drawn_between = at::rand({8});
    (out * at::linspace(-1, 1, out.numel()).reshape(out.sizes())).sum().backward();
    step.x_grad = x.grad();
    step.w1_grad = w1.grad();
    step.w2_grad = w2.grad();
  }));
  LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot after,
                            rng::RngSnapshot::Capture(setup.streams->generators()));
  step.after = std::make_shared<const rng::RngSnapshot>(std::move(after));
  return step;
}

}  // namespace

absl::StatusOr<CheckResult> CheckRecompute(RankSetup& setup) {
  const rng::DefaultGenerators generators = setup.streams->generators();
  checkpoint::CheckpointOptions options;
  if (setup.control == NegativeControl::kAliasingSnapshot) {
    options.rng_streams = std::make_shared<AliasingRngSaver>(generators);
  } else {
    options.rng_streams = checkpoint::StreamSnapshots::Of(setup.streams);
  }
  LOCKSTEP_ASSIGN_OR_RETURN(RecomputeStep plain, RunRecomputeStep(setup, false, options));
  LOCKSTEP_ASSIGN_OR_RETURN(RecomputeStep ckpt, RunRecomputeStep(setup, true, options));
  std::vector<std::string> problems;
  if (ckpt.masks.size() != 2 || !at::equal(ckpt.masks[0], ckpt.masks[1])) {
    problems.push_back("recompute mask != forward mask");
  }
  if (!at::equal(plain.x_grad, ckpt.x_grad)) problems.push_back("input gradient differs");
  if (!at::equal(plain.w1_grad, ckpt.w1_grad) || !at::equal(plain.w2_grad, ckpt.w2_grad)) {
    problems.push_back("parameter gradients differ");
  }
  if (!at::equal(plain.drawn_between, ckpt.drawn_between) || !(*plain.after == *ckpt.after)) {
    problems.push_back("live generator disturbed");
  }
  if (checkpoint::RetainedState().nodes != 0) problems.push_back("state retained");
  at::Tensor flat;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("flattening gradients", [&] {
    flat = at::cat({ckpt.x_grad.flatten(), ckpt.w1_grad.flatten()});
  }));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> grads, setup.groups.world().AllGather(flat));
  const std::vector<int> bad = DisagreeWithLeader(setup.groups.topology(), grads);
  if (!bad.empty()) problems.push_back(absl::StrCat(bad.size(), " replica(s) disagree"));
  LOCKSTEP_RETURN_IF_ERROR(Rewind(setup));
  return CheckResult::Make("checkpoint_recompute", problems.empty(),
                           problems.empty() ? "mask replayed; gradients bit-identical to plain; "
                                              "live RNG untouched; 0 retained; replicas agree"
                                            : absl::StrJoin(problems, "; "));
}

}  // namespace qualification
}  // namespace lockstep
