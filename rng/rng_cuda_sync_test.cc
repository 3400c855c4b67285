// gpu: Synchronize of CPU + CUDA generator state between two processes sharing the GPU (Gloo
// moves the bytes), and its negative control.
#include <vector>

#include "ATen/ATen.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rng/synchronize.h"
#include "testing/process_world.h"

namespace lockstep {
namespace rng {
namespace {

absl::Status DrawAndCompare(collectives::Communicator& world, bool synchronize, bool* equal) {
  const DefaultGenerators gpu{.cuda_device = 0};
  at::manual_seed(700 + world.rank());
  (void)at::rand({world.rank() + 1}, at::TensorOptions().device(at::kCUDA, 0));
  if (synchronize) {
    if (absl::Status s = Synchronize(&world, gpu); !s.ok()) return s;
  }
  at::Tensor draws =
      at::cat({at::rand({32}, at::TensorOptions().device(at::kCUDA, 0)),
               at::dropout(at::ones({128}, at::TensorOptions().device(at::kCUDA, 0)), 0.5, true),
               at::rand({8}).to(at::kCUDA)})
          .cpu();
  auto gathered = world.AllGather(draws);
  if (!gathered.ok()) return gathered.status();
  *equal = at::equal((*gathered)[0], (*gathered)[1]);
  return absl::OkStatus();
}

TEST(CudaSynchronizeTest, ReplicasAgreeOnCudaAndCpuDrawsAfterSynchronize) {
  std::vector<absl::Status> results =
      testing::RunProcessWorld({2}, [](int, collectives::Communicator& world) -> absl::Status {
        bool equal = false;
        if (auto s = DrawAndCompare(world, true, &equal); !s.ok()) return s;
        return equal ? absl::OkStatus() : absl::InternalError("replica draws differ");
      });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

TEST(CudaSynchronizeTest, NegativeControlWithoutSynchronizeReplicasDisagree) {
  std::vector<absl::Status> results =
      testing::RunProcessWorld({2}, [](int, collectives::Communicator& world) -> absl::Status {
        bool equal = true;
        if (auto s = DrawAndCompare(world, false, &equal); !s.ok()) return s;
        return equal ? absl::InternalError("unsynchronized draws agreed") : absl::OkStatus();
      });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace rng
}  // namespace lockstep
