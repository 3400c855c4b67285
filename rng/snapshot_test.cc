#include "rng/snapshot.h"

#include <mutex>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace rng {
namespace {

using ::testing::HasSubstr;

// The value check every snapshot implementation must pass: a snapshot captured before draws,
// then restored, makes the same draws happen again (uniforms and a dropout mask). `capture`
// returns a snapshot; `restore(snapshot)` writes it back and returns a status.
template <typename Capture, typename Restore>
absl::Status CheckSnapshotIsAValue(const Capture& capture, const Restore& restore) {
  at::manual_seed(1234);
  auto snapshot = capture();
  const at::Tensor first = at::rand({64});
  const at::Tensor mask = at::dropout(at::ones({256}), 0.5, /*train=*/true);
  if (absl::Status s = restore(snapshot); !s.ok()) return s;
  if (!at::equal(at::rand({64}), first)) {
    return absl::InternalError("the draws after restoring the snapshot differ from the first");
  }
  if (!at::equal(at::dropout(at::ones({256}), 0.5, true), mask)) {
    return absl::InternalError("the dropout mask after restoring the snapshot differs");
  }
  return absl::OkStatus();
}

// Negative control: a "snapshot" that keeps a handle to the live generator instead of copying
// its state — the bug this module exists to avoid. Restoring it writes back whatever the live
// generator holds at that moment.
class AliasingSnapshot {
 public:
  AliasingSnapshot() : generator_(at::detail::getDefaultCPUGenerator()) {}
  absl::Status Restore() const {
    at::Generator live = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(live.mutex());
    live.set_state(generator_.get_state());
    return absl::OkStatus();
  }

 private:
  at::Generator generator_;
};

TEST(RngSnapshotTest, SnapshotIsAValueAndRestoreIsBitExact) {
  const absl::Status checked =
      CheckSnapshotIsAValue([] { return RngSnapshot::Capture({}); },
                            [](const absl::StatusOr<RngSnapshot>& snapshot) {
                              return snapshot.ok() ? snapshot->Restore() : snapshot.status();
                            });
  EXPECT_TRUE(checked.ok()) << checked;
  // A value: it does not change when the live generator advances.
  at::manual_seed(1234);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RngSnapshot snapshot, RngSnapshot::Capture({}));
  const RngSnapshot copy = snapshot;
  (void)at::rand({64});
  EXPECT_EQ(snapshot, copy);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot advanced, RngSnapshot::Capture({}));
  EXPECT_NE(advanced, copy);
  EXPECT_EQ(snapshot.cpu_seed(), 1234u);
}

TEST(RngSnapshotTest, NegativeControlAliasingSnapshotFailsTheSameCheck) {
  const absl::Status checked =
      CheckSnapshotIsAValue([] { return AliasingSnapshot(); },
                            [](const AliasingSnapshot& alias) { return alias.Restore(); });
  EXPECT_EQ(checked.code(), absl::StatusCode::kInternal)
      << "the value check did not catch an aliasing snapshot";
}

TEST(RngSnapshotTest, SeededEqualsManualSeed) {
  absl::StatusOr<RngSnapshot> seeded = RngSnapshot::Seeded({}, 77, 0);
  ASSERT_TRUE(seeded.ok()) << seeded.status();
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
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot live, RngSnapshot::Capture({}));
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
  absl::Status status = RngSnapshot::Capture(DefaultGenerators::WithCudaDevice(0)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("--config=cuda"));
}

}  // namespace
}  // namespace rng
}  // namespace lockstep
