#include "qualification/aliasing_testutil.h"

#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "checkpoint/checkpoint.h"

namespace lockstep {
namespace qualification {

absl::StatusOr<DropoutBlockRun> RunDropoutBlock(
    const at::TensorOptions& options, std::shared_ptr<const checkpoint::RngStateSaver> saver) {
  at::Tensor w, x;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("making the block", [&] {
    at::manual_seed(11);
    w = (at::randn({64, 64}, options) * 0.3).requires_grad_();
    at::manual_seed(5);
    x = at::randn({32, 64}, options).requires_grad_();
  }));
  auto block = [&](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{at::dropout(at::matmul(in[0], w), 0.5, true)};
  };
  at::Tensor out;
  if (saver != nullptr) {
    checkpoint::CheckpointOptions checkpointed;
    checkpointed.rng_streams = std::move(saver);
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> outs,
                              checkpoint::Checkpoint(block, {x}, checkpointed));
    out = outs[0];
  } else {
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("running the block", [&] { out = block({x})[0]; }));
  }
  DropoutBlockRun run;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("backward", [&] {
    (out * at::linspace(-1, 1, out.numel(), options).reshape(out.sizes())).sum().backward();
    run.output = out.detach().cpu();
    run.weight_grad = w.grad().cpu();
  }));
  return run;
}

}  // namespace qualification
}  // namespace lockstep
