// gpu: the CUDA halves of rng/ — generator snapshots, the model stream and named streams over
// the rank's CUDA generator, graph-safe snapshots under graph capture, and Philox on CUDA equal to
// CPU.
#include <mutex>
#include <optional>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/cuda/CUDAGeneratorImpl.h"
#include "ATen/cuda/CUDAGraph.h"
#include "absl/status/statusor.h"
#include "base/status_testutil.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rng/philox.h"
#include "rng/rank_streams.h"
#include "rng/snapshot.h"
#include "torch/cuda.h"

namespace lockstep {
namespace rng {
namespace {

const DefaultGenerators kGpu = DefaultGenerators::WithCudaDevice(0);

absl::StatusOr<std::shared_ptr<RankStreams>> GpuStreams() { return RankStreams::Create(kGpu); }
const at::TensorOptions kCuda = at::TensorOptions().device(at::kCUDA, 0);

at::Tensor CudaDraws() {
  return at::cat({at::rand({64}, kCuda), at::dropout(at::ones({256}, kCuda), 0.5, true)}).cpu();
}

TEST(CudaGeneratorStateTest, SnapshotIsAValueAndRestoreIsBitExact) {
  at::manual_seed(321);
  (void)CudaDraws();
  absl::StatusOr<RngSnapshot> snapshot = RngSnapshot::Capture(kGpu);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  ASSERT_TRUE(snapshot->cuda().has_value());
  const RngSnapshot copy = *snapshot;
  at::Tensor cuda_first = CudaDraws();
  at::Tensor cpu_first = at::rand({16});
  EXPECT_EQ(*snapshot, copy);  // a value: unchanged by the draws
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot live, RngSnapshot::Capture(kGpu));
  EXPECT_NE(live.cuda()->offset, copy.cuda()->offset);  // live moved
  ASSERT_TRUE(snapshot->Restore().ok());
  EXPECT_TRUE(at::equal(CudaDraws(), cuda_first));
  EXPECT_TRUE(at::equal(at::rand({16}), cpu_first));
}

TEST(CudaGeneratorStateTest, ModelStreamLeavesTheCallersCudaDrawsUntouched) {
  at::manual_seed(5);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot caller, RngSnapshot::Capture(kGpu));
  at::Tensor expected = CudaDraws();
  ASSERT_TRUE(caller.Restore().ok());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto model, GpuStreams());
  at::Tensor first, second;
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*model));
    first = CudaDraws();
  }
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*model));
    second = CudaDraws();
  }
  EXPECT_FALSE(at::equal(first, second));  // the model stream advances on CUDA too
  EXPECT_FALSE(at::equal(first, expected));
  EXPECT_TRUE(at::equal(CudaDraws(), expected));
}

TEST(CudaGeneratorStateTest, CudaOnlyReseedInsideAScopeIsKeptAndCpuIsRestored) {
  at::manual_seed(8);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot caller, RngSnapshot::Capture(kGpu));
  at::Tensor cpu_expected = at::rand({8});
  ASSERT_TRUE(caller.Restore().ok());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto model, GpuStreams());
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*model));
    (void)at::rand({5});
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(0);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(99);  // the caller's code reseeds only the CUDA generator
  }
  at::Tensor cuda_after = at::rand({16}, kCuda).cpu();
  EXPECT_TRUE(at::equal(at::rand({8}), cpu_expected));  // CPU back to the caller's state
  {
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(0);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(99);
  }
  EXPECT_TRUE(at::equal(at::rand({16}, kCuda).cpu(), cuda_after));  // CUDA reseed kept
}

TEST(CudaGeneratorStateTest, NamedStreamSeedsTheCudaGenerator) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams, GpuStreams());
  NamedStreamTracker& tracker = streams->named();
  ASSERT_TRUE(tracker.Add("tp", 4242).ok());
  at::Tensor forked;
  {
    auto fork = tracker.Fork("tp");
    ASSERT_TRUE(fork.ok()) << fork.status();
    forked = at::rand({32}, kCuda).cpu();
  }
  at::manual_seed(4242);
  EXPECT_TRUE(at::equal(at::rand({32}, kCuda).cpu(), forked));
}

// Captured sequence: a from the snapshot's position, rewind, b (must equal a), back to the live
// position, c (must continue after a). Replay must equal the same draws made eagerly.
TEST(CudaGeneratorStateTest, InCaptureSnapshotRewindsCapturedDrawsAndReplayMatchesEager) {
  at::manual_seed(77);
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  at::Tensor a, b, c;
  absl::Status rewind, back;
  std::optional<CudaCapturePosition> start_position, live_position;
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    graph.capture_begin();
    absl::StatusOr<RngSnapshot> start = RngSnapshot::Capture(kGpu);
    a = at::rand({1000}, kCuda);
    absl::StatusOr<RngSnapshot> live = RngSnapshot::Capture(kGpu);
    rewind = start.ok() ? start->Restore() : start.status();
    b = at::rand({1000}, kCuda);
    back = live.ok() ? live->Restore() : live.status();
    c = at::rand({1000}, kCuda);
    graph.capture_end();
    ASSERT_TRUE(start.ok()) << start.status();
    ASSERT_TRUE(live.ok()) << live.status();
    start_position = start->cuda()->in_capture;
    live_position = live->cuda()->in_capture;
  }
  ASSERT_TRUE(rewind.ok()) << rewind;
  ASSERT_TRUE(back.ok()) << back;
  ASSERT_TRUE(start_position.has_value());
  ASSERT_TRUE(live_position.has_value());
  EXPECT_LT(start_position->offset_intragraph, live_position->offset_intragraph);

  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot before_replay, RngSnapshot::Capture(kGpu));
  graph.replay();
  torch::cuda::synchronize();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot after_replay, RngSnapshot::Capture(kGpu));
  EXPECT_TRUE(at::equal(a.cpu(), b.cpu())) << "the rewound draw differs from the original";
  EXPECT_FALSE(at::equal(a.cpu(), c.cpu())) << "the live position was not put back";

  ASSERT_TRUE(before_replay.Restore().ok());
  at::Tensor eager_a = at::rand({1000}, kCuda);
  at::Tensor eager_c = at::rand({1000}, kCuda);
  EXPECT_TRUE(at::equal(a.cpu(), eager_a.cpu()));
  EXPECT_TRUE(at::equal(c.cpu(), eager_c.cpu()));
  // The rewind does not enlarge the graph's offset increment: replay advanced the live generator
  // exactly as the two eager draws did.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot after_eager, RngSnapshot::Capture(kGpu));
  EXPECT_EQ(after_eager, after_replay);
}

TEST(CudaGeneratorStateTest, GraphRelativeAndEagerStatesDoNotCrossTheCaptureBoundary) {
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot eager, RngSnapshot::Capture(kGpu));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto model, GpuStreams());
  absl::StatusOr<RngSnapshot> in_capture;
  absl::Status eager_in_capture, scope_in_capture;
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    graph.capture_begin();
    in_capture = RngSnapshot::Capture(kGpu);
    eager_in_capture = eager.Restore();
    scope_in_capture = ModelStreamScope::Enter(*model).status();
    graph.capture_end();
  }
  ASSERT_TRUE(in_capture.ok()) << in_capture.status();
  EXPECT_EQ(eager_in_capture.code(), absl::StatusCode::kFailedPrecondition) << eager_in_capture;
  EXPECT_THAT(eager_in_capture.message(), ::testing::HasSubstr("outside CUDA graph capture"));
  EXPECT_EQ(scope_in_capture.code(), absl::StatusCode::kFailedPrecondition) << scope_in_capture;
  absl::Status after = in_capture->Restore();
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition) << after;
  EXPECT_THAT(after.message(), ::testing::HasSubstr("graph-relative"));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot after_refusal, RngSnapshot::Capture(kGpu));
  EXPECT_EQ(after_refusal, eager) << "a refused restore changed the generators";
}

// The refusal path of a LibTorch without graph-safe state, selected by the testing switch:
// deterministic capture still works, a rewind over stochastic ops is refused by name.
TEST(CudaGeneratorStateTest, WithoutGraphSafeStateOnlyStochasticRewindsAreRefused) {
  ASSERT_TRUE(internal::GraphSafeCudaStateAvailable());
  internal::SetGraphSafeCudaStateEnabledForTesting(false);
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  at::Tensor x = at::ones({16}, kCuda);
  at::Tensor y;
  absl::Status deterministic, stochastic;
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    graph.capture_begin();
    absl::StatusOr<RngSnapshot> first = RngSnapshot::Capture(kGpu);
    y = x * 2;
    deterministic = first.ok() ? first->Restore() : first.status();
    absl::StatusOr<RngSnapshot> second = RngSnapshot::Capture(kGpu);
    at::Tensor noise = at::rand({16}, kCuda);
    stochastic = second.ok() ? second->Restore() : second.status();
    graph.capture_end();
  }
  internal::SetGraphSafeCudaStateEnabledForTesting(true);
  EXPECT_TRUE(deterministic.ok()) << deterministic;
  EXPECT_EQ(stochastic.code(), absl::StatusCode::kFailedPrecondition) << stochastic;
  EXPECT_THAT(stochastic.message(), ::testing::HasSubstr("no graph-safe generator state"));
  graph.replay();
  EXPECT_TRUE(at::equal(y.cpu(), at::full({16}, 2.0f)));
}

TEST(PhiloxCudaTest, CudaValuesEqualCpuValuesBitForBit) {
  const c10::Device cpu(c10::kCPU), gpu(c10::kCUDA, 0);
  const PhiloxKey key{0xfeedfacecafebeefull, 3, 11};
  const std::vector<int64_t> shape = {6, 40, 7};
  const std::vector<std::vector<Slice>> boxes = {
      {{0, 6}, {0, 40}, {0, 7}}, {{1, 4}, {10, 30}, {2, 7}}, {{0, 6}, {40, 40}, {0, 7}}};
  for (const auto& box : boxes) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor on_cpu, PartitionedUniform(key, shape, box, cpu));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor on_gpu, PartitionedUniform(key, shape, box, gpu));
    EXPECT_TRUE(on_gpu.is_cuda());
    EXPECT_TRUE(at::equal(on_gpu.cpu(), on_cpu));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor mask_on_gpu,
                                  PartitionedDropoutMask(key, shape, box, 0.3, gpu));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor mask_on_cpu,
                                  PartitionedDropoutMask(key, shape, box, 0.3, cpu));
    EXPECT_TRUE(at::equal(mask_on_gpu.cpu(), mask_on_cpu));
  }
  // Dropout boxes: the whole tensor; whole rows from a multiple of 4 (Note [Contiguous dropout]:
  // vector loads); whole rows from 308 (a multiple of 4, not of 8: 2-byte types take two blocks
  // per thread); a run starting at an odd global index (595) with an odd count (245); a box
  // that is not one run (the general kernel).
  const std::vector<std::vector<Slice>> dropout_boxes = {boxes[0],
                                                         {{1, 4}, {0, 40}, {0, 7}},
                                                         {{1, 2}, {4, 40}, {0, 7}},
                                                         {{2, 3}, {5, 40}, {0, 7}},
                                                         boxes[1]};
  for (at::ScalarType type : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    for (const auto& box : dropout_boxes) {
      for (bool misaligned : {false, true}) {
        at::manual_seed(1);
        std::vector<int64_t> box_shape;
        int64_t numel = 1;
        for (const Slice& slice : box) {
          box_shape.push_back(slice.end - slice.begin);
          numel *= slice.end - slice.begin;
        }
        at::Tensor x = at::randn({numel}).to(type).reshape(box_shape);
        // The same values one element into a CUDA buffer: no vector loads on that path.
        at::Tensor on_gpu = x.to(at::kCUDA);
        if (misaligned) {
          on_gpu = at::cat({at::zeros({1}, on_gpu.options()), on_gpu.reshape({-1})})
                       .slice(0, 1)
                       .reshape(box_shape);
        }
        absl::StatusOr<at::Tensor> want = PartitionedDropout(x, key, shape, box, 0.25);
        absl::StatusOr<at::Tensor> got = PartitionedDropout(on_gpu, key, shape, box, 0.25);
        ASSERT_TRUE(want.ok()) << want.status();
        ASSERT_TRUE(got.ok()) << got.status();
        at::Tensor diff = (got->cpu().to(at::kDouble) - want->to(at::kDouble)).abs();
        EXPECT_TRUE(at::equal(got->cpu(), *want))
            << c10::toString(type) << " box from " << box[0].begin << "," << box[1].begin
            << (misaligned ? " (misaligned)" : "") << ": max |diff| " << diff.max().item<double>()
            << " at " << diff.argmax().item<int64_t>() << " of " << diff.numel() << ", "
            << (diff > 0).sum().item<int64_t>() << " differ";
      }
    }
  }
}

TEST(CudaRankStreamsTest, CheckGeneratorsRefusesStatesOfOtherGenerators) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams, GpuStreams());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RngSnapshot cpu_only, RngSnapshot::Seeded({}, 1, 1));
  const absl::Status refused = streams->CheckGenerators(cpu_only, "a CPU-only snapshot");
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("a CPU-only snapshot holds state for CUDA "
                                                      "device -1"));
  EXPECT_EQ(streams->model().Restore(cpu_only).code(), absl::StatusCode::kInvalidArgument);
  std::map<std::string, NamedStreamTracker::Stream> named;
  named.emplace("tp", NamedStreamTracker::Stream{3, cpu_only});
  EXPECT_EQ(streams->named().Restore(named).code(), absl::StatusCode::kInvalidArgument);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RngSnapshot gpu, RngSnapshot::Seeded(kGpu, 1, 1));
  LOCKSTEP_EXPECT_OK(streams->CheckGenerators(gpu, "a GPU snapshot"));
}

}  // namespace
}  // namespace rng
}  // namespace lockstep
