// gpu: Synchronize of CPU + CUDA generator state between two processes sharing the GPU (Gloo
// moves the bytes), and its negative control.
#include <vector>

#include "ATen/ATen.h"
#include "collectives/process_world.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rng/rank_streams.h"
#include "rng/synchronize.h"

namespace lockstep {
namespace rng {
namespace {

collectives::ProcessWorldOptions Two() {
  collectives::ProcessWorldOptions options;
  options.world_size = 2;
  return options;
}

absl::Status DrawAndCompare(collectives::Communicator& world, bool synchronize, bool* equal) {
  absl::StatusOr<std::shared_ptr<RankStreams>> streams =
      RankStreams::Create(DefaultGenerators::WithCudaDevice(0));
  if (!streams.ok()) return streams.status();
  at::manual_seed(700 + world.rank());
  (void)at::rand({world.rank() + 1}, at::TensorOptions().device(at::kCUDA, 0));
  if (synchronize) {
    if (absl::Status s = Synchronize(&world, **streams); !s.ok()) return s;
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
  std::vector<absl::Status> results = collectives::RunProcessWorld(
      Two(), [](int, collectives::Communicator& world) -> absl::Status {
        bool equal = false;
        if (auto s = DrawAndCompare(world, true, &equal); !s.ok()) return s;
        return equal ? absl::OkStatus() : absl::InternalError("replica draws differ");
      });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

TEST(CudaSynchronizeTest, NegativeControlWithoutSynchronizeReplicasDisagree) {
  std::vector<absl::Status> results = collectives::RunProcessWorld(
      Two(), [](int, collectives::Communicator& world) -> absl::Status {
        bool equal = true;
        if (auto s = DrawAndCompare(world, false, &equal); !s.ok()) return s;
        return equal ? absl::InternalError("unsynchronized draws agreed") : absl::OkStatus();
      });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace rng
}  // namespace lockstep
