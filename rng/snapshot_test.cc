#include "rng/snapshot.h"

#include <mutex>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace rng {
namespace {

using ::testing::HasSubstr;

// Negative control: a "snapshot" that keeps a handle to the live generator instead of copying
// its state — the bug this module exists to avoid. It changes when the generator advances.
class AliasingSnapshot {
 public:
  AliasingSnapshot() : generator_(at::detail::getDefaultCPUGenerator()) {}
  void Restore() const {
    // Restoring from the alias writes back whatever the live generator holds *now*.
    at::Generator live = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(live.mutex());
    live.set_state(generator_.get_state());
  }

 private:
  at::Generator generator_;
};

TEST(RngSnapshotTest, SnapshotIsAValueAndRestoreIsBitExact) {
  at::manual_seed(1234);
  absl::StatusOr<RngSnapshot> snapshot = RngSnapshot::Capture({});
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  const RngSnapshot copy = *snapshot;
  at::Tensor first = at::rand({64});
  at::Tensor mask = at::dropout(at::ones({256}), 0.5, /*train=*/true);
  // The live generator advanced; the snapshot did not.
  EXPECT_EQ(*snapshot, copy);
  EXPECT_NE(*RngSnapshot::Capture({}), copy);
  ASSERT_TRUE(snapshot->Restore().ok());
  EXPECT_TRUE(at::equal(at::rand({64}), first));
  EXPECT_TRUE(at::equal(at::dropout(at::ones({256}), 0.5, true), mask));
  EXPECT_EQ(snapshot->cpu_seed(), 1234u);
}

TEST(RngSnapshotTest, NegativeControlAliasingSnapshotFailsTheSameCheck) {
  at::manual_seed(1234);
  AliasingSnapshot alias;
  at::Tensor first = at::rand({64});
  alias.Restore();
  // The alias "restores" the advanced state, so the draws do not repeat: the check above
  // (draws after Restore equal the first draws) would catch this implementation.
  EXPECT_FALSE(at::equal(at::rand({64}), first));
}

TEST(RngSnapshotTest, SeededEqualsManualSeed) {
  absl::StatusOr<RngSnapshot> seeded = RngSnapshot::Seeded({}, 77, 0);
  ASSERT_TRUE(seeded.ok());
  at::manual_seed(999);
  ASSERT_TRUE(seeded->Restore().ok());
  at::Tensor from_snapshot = at::randn({32});
  at::manual_seed(77);
  EXPECT_TRUE(at::equal(at::randn({32}), from_snapshot));
  EXPECT_EQ(seeded->cpu_seed(), 77u);
}

TEST(RngSnapshotTest, FromPartsValidatesAndRoundTrips) {
  at::manual_seed(5);
  (void)at::rand({3});
  RngSnapshot live = *RngSnapshot::Capture({});
  absl::StatusOr<RngSnapshot> parsed = RngSnapshot::FromParts(live.cpu_state(), std::nullopt);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, live);
  EXPECT_EQ(parsed->cpu_seed(), 5u);
  absl::Status short_state = RngSnapshot::FromParts("abc", std::nullopt).status();
  EXPECT_EQ(short_state.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_state.message(), HasSubstr("has 3 bytes"));
}

TEST(RngSnapshotTest, CudaDeviceWithoutCudaSupportIsRefused) {
  if (LOCKSTEP_BUILT_WITH_CUDA)
    GTEST_SKIP() << "CUDA build: rng_cuda_test covers the CUDA generator";
  // This test binary is built without CUDA: the CUDA half is not linked in.
  absl::Status status = RngSnapshot::Capture({.cuda_device = 0}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("--config=cuda"));
}

}  // namespace
}  // namespace rng
}  // namespace lockstep
