// gpu: qualify's aliasing-snapshot negative control on the CUDA generator (moved here from
// checkpoint_cuda_test with the saver): a checkpointed block whose saver aliases the live
// generators recomputes another CUDA dropout mask, while the value saver reproduces the plain
// block's gradients bit for bit.

#include <memory>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/rng_state_saver.h"
#include "gtest/gtest.h"
#include "rng/generators.h"
#include "tools/negative_controls.h"

namespace lockstep {
namespace qualification {
namespace {

TEST(AliasingRngSaverCudaTest, ChangesTheRecomputedCudaMask) {
  const at::TensorOptions cuda = at::TensorOptions().device(at::kCUDA, 0);
  auto run = [&](std::shared_ptr<const checkpoint::RngStateSaver> saver, bool checkpointed) {
    at::manual_seed(11);
    at::Tensor w = (at::randn({64, 64}, cuda) * 0.3).requires_grad_();
    at::manual_seed(5);
    at::Tensor x = at::randn({32, 64}, cuda).requires_grad_();
    auto block = [&](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{at::dropout(at::matmul(in[0], w), 0.5, true)};
    };
    checkpoint::CheckpointOptions options;
    options.rng_streams = std::move(saver);
    at::Tensor out =
        checkpointed ? checkpoint::Checkpoint(block, {x}, options).value()[0] : block({x})[0];
    (out * at::linspace(-1, 1, out.numel(), cuda).reshape(out.sizes())).sum().backward();
    return std::make_pair(out.detach().cpu(), w.grad().cpu());
  };
  const rng::DefaultGenerators gpu = rng::DefaultGenerators::WithCudaDevice(0);
  const auto plain = run(nullptr, false);
  const auto broken = run(std::make_shared<AliasingRngSaver>(gpu), true);
  EXPECT_TRUE(at::equal(plain.first, broken.first)) << "forward is unaffected";
  EXPECT_FALSE(at::equal(plain.second, broken.second))
      << "negative control: an aliasing snapshot must change the recomputed mask";
  const auto sound = run(checkpoint::StreamSnapshots::DefaultGeneratorsOnly(gpu), true);
  EXPECT_TRUE(at::equal(plain.second, sound.second));
  EXPECT_EQ(checkpoint::RetainedState().nodes, 0);
}

}  // namespace
}  // namespace qualification
}  // namespace lockstep
