// qualification/aliasing_testutil.h  (testonly)
//
// The step the aliasing-snapshot negative control is tested on, on the CPU and (in a gpu test)
// on CUDA: a dropout block over a fixed weight, run plainly or as an activation checkpoint with a
// given RNG saver, then backward through a weighted sum. An aliasing saver leaves the forward as
// it is but changes the recomputed mask, hence the weight's gradient.

#ifndef LOCKSTEP_QUALIFICATION_ALIASING_TESTUTIL_H_
#define LOCKSTEP_QUALIFICATION_ALIASING_TESTUTIL_H_

#include <memory>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "checkpoint/rng_state_saver.h"

namespace lockstep {
namespace qualification {

struct DropoutBlockRun {
  at::Tensor output;       // on the CPU
  at::Tensor weight_grad;  // on the CPU
};

// Runs the block on `options`' device; checkpointed with `saver` when it is not null.
absl::StatusOr<DropoutBlockRun> RunDropoutBlock(
    const at::TensorOptions& options, std::shared_ptr<const checkpoint::RngStateSaver> saver);

}  // namespace qualification
}  // namespace lockstep

#endif  // LOCKSTEP_QUALIFICATION_ALIASING_TESTUTIL_H_
