// collectives/commanded_world: peers run exactly the commanded operations (a broadcast only
// completes when every peer runs it), worlds start and stop cleanly, unknown sizes have no rank 0.

#include "testing/commanded_world.h"

#include <atomic>

#include "ATen/ATen.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace collectives {
namespace {

constexpr int64_t kBroadcast = 1;

// A broadcast from rank 0 of a payload whose bytes rank 0 sets to the iteration.
absl::Status Operation(Communicator& comm, int64_t op, at::Tensor& payload) {
  if (op != kBroadcast) return absl::InvalidArgumentError("unknown operation");
  return comm.Broadcast(payload, 0);
}

TEST(CommandedGlooWorldsTest, PeersFollowRankZerosCommands) {
  CommandedGlooWorlds worlds(Operation);
  worlds.Start({2, 3});
  for (int size : {2, 3}) {
    Communicator* rank0 = worlds.rank0(size);
    ASSERT_NE(rank0, nullptr) << "world of " << size;
    EXPECT_EQ(rank0->size(), size);
    ASSERT_TRUE(worlds.Command(size, kBroadcast, 64, 5).ok());
    at::Tensor payload = at::zeros({64}, at::kByte);
    for (int i = 0; i < 5; ++i) {
      payload.fill_(i);
      ASSERT_TRUE(Operation(*rank0, kBroadcast, payload).ok()) << "iteration " << i;
    }
    // The peers are waiting for the next command again: a barrier-like broadcast proves it.
    ASSERT_TRUE(worlds.Command(size, kBroadcast, 8, 1).ok());
    at::Tensor one = at::zeros({8}, at::kByte);
    EXPECT_TRUE(Operation(*rank0, kBroadcast, one).ok());
  }
  EXPECT_EQ(worlds.rank0(4), nullptr);
  EXPECT_FALSE(worlds.Command(4, kBroadcast, 8, 1).ok());
  worlds.Stop();
  EXPECT_EQ(worlds.rank0(2), nullptr);
}

}  // namespace
}  // namespace collectives
}  // namespace lockstep
