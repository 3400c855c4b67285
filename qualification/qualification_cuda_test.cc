// gpu: qualify's aliasing-snapshot negative control on the CUDA generator (moved here from
// checkpoint_cuda_test with the saver): a checkpointed block whose saver aliases the live
// generators recomputes another CUDA dropout mask, while the value saver reproduces the plain
// block's gradients bit for bit.

#include <memory>

#include "ATen/ATen.h"
#include "base/status_testutil.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/rng_state_saver.h"
#include "gtest/gtest.h"
#include "qualification/aliasing_testutil.h"
#include "qualification/negative_controls.h"
#include "rng/generators.h"
#include "rng/rank_streams.h"

namespace lockstep {
namespace qualification {
namespace {

TEST(AliasingRngSaverCudaTest, ChangesTheRecomputedCudaMask) {
  const rng::DefaultGenerators gpu = rng::DefaultGenerators::WithCudaDevice(0);
  const at::TensorOptions cuda = at::TensorOptions().device(at::kCUDA, 0);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(DropoutBlockRun plain, RunDropoutBlock(cuda, nullptr));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(DropoutBlockRun broken,
                                RunDropoutBlock(cuda, std::make_shared<AliasingRngSaver>(gpu)));
  EXPECT_TRUE(at::equal(plain.output, broken.output)) << "forward is unaffected";
  EXPECT_FALSE(at::equal(plain.weight_grad, broken.weight_grad))
      << "negative control: an aliasing snapshot must change the recomputed mask";
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<rng::RankStreams> streams,
                                rng::RankStreams::Create(gpu));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(DropoutBlockRun sound,
                                RunDropoutBlock(cuda, checkpoint::StreamSnapshots::Of(streams)));
  EXPECT_TRUE(at::equal(plain.weight_grad, sound.weight_grad));
  EXPECT_EQ(checkpoint::RetainedState().nodes, 0);
}

}  // namespace
}  // namespace qualification
}  // namespace lockstep
