// gpu: the CUDA halves of rng/ — generator snapshots, the model stream and named streams over
// the rank's CUDA generator, refusal under graph capture, and Philox on CUDA equal to CPU.
#include <mutex>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/cuda/CUDAGeneratorImpl.h"
#include "ATen/cuda/CUDAGraph.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rng/generator_state.h"
#include "rng/model_stream.h"
#include "rng/named_streams.h"
#include "rng/philox.h"

namespace lockstep {
namespace rng {
namespace {

const DefaultGenerators kGpu{.cuda_device = 0};
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
  EXPECT_NE(RngSnapshot::Capture(kGpu)->cuda()->offset, copy.cuda()->offset);  // live moved
  ASSERT_TRUE(snapshot->Restore().ok());
  EXPECT_TRUE(at::equal(CudaDraws(), cuda_first));
  EXPECT_TRUE(at::equal(at::rand({16}), cpu_first));
}

TEST(CudaGeneratorStateTest, ModelStreamLeavesTheCallersCudaDrawsUntouched) {
  at::manual_seed(5);
  const RngSnapshot caller = *RngSnapshot::Capture(kGpu);
  at::Tensor expected = CudaDraws();
  ASSERT_TRUE(caller.Restore().ok());
  ModelStream model(kGpu);
  at::Tensor first, second;
  {
    ModelStreamScope scope(model);
    first = CudaDraws();
  }
  {
    ModelStreamScope scope(model);
    second = CudaDraws();
  }
  EXPECT_FALSE(at::equal(first, second));  // the model stream advances on CUDA too
  EXPECT_FALSE(at::equal(first, expected));
  EXPECT_TRUE(at::equal(CudaDraws(), expected));
}

TEST(CudaGeneratorStateTest, CudaOnlyReseedInsideAScopeIsKeptAndCpuIsRestored) {
  at::manual_seed(8);
  const RngSnapshot caller = *RngSnapshot::Capture(kGpu);
  at::Tensor cpu_expected = at::rand({8});
  ASSERT_TRUE(caller.Restore().ok());
  ModelStream model(kGpu);
  {
    ModelStreamScope scope(model);
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
  NamedStreamTracker tracker(kGpu);
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

TEST(CudaGeneratorStateTest, CaptureDuringGraphCaptureIsRefused) {
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  c10::cuda::CUDAStreamGuard guard(side);
  at::Tensor x = at::ones({16}, kCuda);
  at::cuda::CUDAGraph graph;
  graph.capture_begin();
  absl::Status status = RngSnapshot::Capture(kGpu).status();
  at::Tensor y = x * 2;  // deterministic capture still works
  graph.capture_end();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(), ::testing::HasSubstr("graph capture"));
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
    at::Tensor on_cpu = *PartitionedUniform(key, shape, box, cpu);
    at::Tensor on_gpu = *PartitionedUniform(key, shape, box, gpu);
    EXPECT_TRUE(on_gpu.is_cuda());
    EXPECT_TRUE(at::equal(on_gpu.cpu(), on_cpu));
    EXPECT_TRUE(at::equal(PartitionedDropoutMask(key, shape, box, 0.3, gpu)->cpu(),
                          *PartitionedDropoutMask(key, shape, box, 0.3, cpu)));
  }
  for (at::ScalarType type : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    at::manual_seed(1);
    at::Tensor x = at::randn({6, 40, 7}).to(type);
    absl::StatusOr<at::Tensor> want = PartitionedDropout(x, key, shape, boxes[0], 0.25);
    absl::StatusOr<at::Tensor> got =
        PartitionedDropout(x.to(at::kCUDA), key, shape, boxes[0], 0.25);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    at::Tensor diff = (got->cpu().to(at::kDouble) - want->to(at::kDouble)).abs();
    EXPECT_TRUE(at::equal(got->cpu(), *want))
        << c10::toString(type) << ": max |diff| " << diff.max().item<double>() << " at "
        << diff.argmax().item<int64_t>() << " of " << diff.numel() << ", "
        << (diff > 0).sum().item<int64_t>() << " differ";
  }
}

}  // namespace
}  // namespace rng
}  // namespace lockstep
