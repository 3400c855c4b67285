// gpu: a rewound graph position left installed after its capture ended (a restore during capture
// not followed by restoring the live state) is reported by name by Capture and Restore instead
// of failing later in an unrelated draw. Its own binary: it leaves the generator unusable.
#include "ATen/ATen.h"
#include "ATen/cuda/CUDAGraph.h"
#include "absl/status/statusor.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rng/snapshot.h"

namespace lockstep {
namespace rng {
namespace {

const DefaultGenerators kGpu = DefaultGenerators::WithCudaDevice(0);

TEST(CudaGeneratorLeftoverTest, ARewoundPositionLeftPastTheCaptureIsNamed) {
  const at::TensorOptions cuda = at::TensorOptions().device(at::kCUDA, 0);
  const absl::StatusOr<RngSnapshot> eager = RngSnapshot::Capture(kGpu);
  ASSERT_TRUE(eager.ok()) << eager.status();
  absl::Status rewind;
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    graph.capture_begin();
    absl::StatusOr<RngSnapshot> start = RngSnapshot::Capture(kGpu);
    (void)at::rand({64}, cuda);
    rewind = start.ok() ? start->Restore() : start.status();  // never put back: the bug
    graph.capture_end();
  }
  ASSERT_TRUE(rewind.ok()) << rewind;
  absl::Status captured = RngSnapshot::Capture(kGpu).status();
  EXPECT_EQ(captured.code(), absl::StatusCode::kFailedPrecondition) << captured;
  EXPECT_THAT(captured.message(), ::testing::HasSubstr("capture that has ended"));
  absl::Status restored = eager->Restore();
  EXPECT_EQ(restored.code(), absl::StatusCode::kFailedPrecondition) << restored;
  EXPECT_THAT(restored.message(), ::testing::HasSubstr("capture that has ended"));
  // The hazard the refusal names: an ordinary draw now fails too.
  EXPECT_ANY_THROW((void)at::rand({8}, cuda));
}

}  // namespace
}  // namespace rng
}  // namespace lockstep
