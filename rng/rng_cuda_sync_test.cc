// gpu: Synchronize of CPU + CUDA generator state between two processes sharing the GPU (Gloo
// moves the bytes), and across every GPU of the machine over NCCL (one process per GPU; CPU
// state staged through each NCCL staging mode), each with its negative control.
#include <vector>

#include "ATen/ATen.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rng/rank_streams.h"
#include "rng/synchronize.h"
#include "testing/nccl_world.h"
#include "testing/process_world.h"

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

// One process per GPU, seeded differently; with `synchronize`, several rounds of draws each
// followed by Synchronize over NCCL must agree on every GPU (CPU and CUDA draws); without it they
// must not. The draws of each round are gathered and compared on every rank.
absl::Status NcclRounds(int rank, collectives::NcclCommunicator& world, bool synchronize) {
  absl::StatusOr<std::shared_ptr<RankStreams>> streams =
      RankStreams::Create(DefaultGenerators::WithCudaDevice(rank));
  if (!streams.ok()) return streams.status();
  const auto cuda = at::TensorOptions().device(at::kCUDA, rank);
  at::manual_seed(900 + rank);
  for (int round = 0; round < 20; ++round) {
    (void)at::rand({rank + round + 1});  // the ranks drift apart again
    (void)at::rand({rank + 1}, cuda);
    if (synchronize) {
      if (absl::Status s = Synchronize(&world, **streams); !s.ok()) return s;
    }
    at::Tensor draws = at::cat({at::rand({16}), at::rand({32}, cuda).cpu(),
                                at::dropout(at::ones({64}, cuda), 0.5, true).cpu()});
    absl::StatusOr<std::vector<at::Tensor>> gathered = world.AllGather(draws);
    if (!gathered.ok()) return gathered.status();
    bool all_equal = true;
    for (const at::Tensor& other : *gathered) all_equal = all_equal && at::equal(other, draws);
    if (all_equal != synchronize) {
      return absl::InternalError(absl::StrCat("round ", round, ": draws ",
                                              all_equal ? "agree" : "differ", " across ",
                                              world.size(), " GPUs"));
    }
  }
  return absl::OkStatus();
}

// The paths the hand-back's CPU bytes can take between GPUs of one host (see
// collectives/nccl_communicator.h): the host lane, NCCL zero-copy, NCCL with staging copies.
struct CpuPath {
  const char* name;
  collectives::NcclCommunicator::CpuStaging staging;
  bool host_lane;
};

class NcclSynchronize : public ::testing::TestWithParam<CpuPath> {};

TEST_P(NcclSynchronize, EveryGpuAgreesAfterSynchronize) {
  collectives::NcclWorldOptions options;
  options.cpu_staging = GetParam().staging;
  options.host_lane = GetParam().host_lane;
  const bool host_lane = GetParam().host_lane;
  collectives::NcclWorldResult result = collectives::RunNcclWorld(
      options, [host_lane](int rank, collectives::NcclCommunicator& world) -> absl::Status {
        if (world.uses_host_lane() != host_lane) {
          return absl::InternalError("the host lane is not as configured");
        }
        return NcclRounds(rank, world, /*synchronize=*/true);
      });
  if (!result.skip_reason.empty()) GTEST_SKIP() << result.skip_reason;
  for (const absl::Status& s : result.ranks) EXPECT_TRUE(s.ok()) << s;
}

TEST_P(NcclSynchronize, NegativeControlWithoutSynchronizeGpusDisagree) {
  collectives::NcclWorldOptions options;
  options.cpu_staging = GetParam().staging;
  options.host_lane = GetParam().host_lane;
  collectives::NcclWorldResult result =
      collectives::RunNcclWorld(options, [](int rank, collectives::NcclCommunicator& world) {
        return NcclRounds(rank, world, /*synchronize=*/false);
      });
  if (!result.skip_reason.empty()) GTEST_SKIP() << result.skip_reason;
  for (const absl::Status& s : result.ranks) EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(
    EveryPath, NcclSynchronize,
    ::testing::Values(
        CpuPath{"HostLane", collectives::NcclCommunicator::CpuStaging::kMappedHost, true},
        CpuPath{"NcclZeroCopy", collectives::NcclCommunicator::CpuStaging::kMappedHost, false},
        CpuPath{"NcclCopies", collectives::NcclCommunicator::CpuStaging::kDeviceCopies, false}),
    [](const ::testing::TestParamInfo<CpuPath>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace rng
}  // namespace lockstep
