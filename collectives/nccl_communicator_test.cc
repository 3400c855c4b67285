// gpu: NcclCommunicator in one process on the rank's GPU (a world of one), its refusal of a
// device that does not exist, and its bounded wait for a peer that never joins (at the
// rendezvous, or after it at the communicator's creation).
#include "collectives/nccl_communicator.h"

#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_testutil.h"
#include "base/stopwatch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace collectives {
namespace {

using ::testing::HasSubstr;

std::string StorePath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/nccl_store_", name, "_", getpid());
}

absl::StatusOr<std::shared_ptr<Rendezvous>> FileRendezvous(const std::string& name, int rank,
                                                           int size, absl::Duration timeout) {
  return Rendezvous::File(StorePath(name), rank, size, timeout);
}

TEST(NcclCommunicatorTest, WorldOfOneMovesCudaAndStagedCpuTensors) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Rendezvous> rendezvous,
                                FileRendezvous("one", 0, 1, absl::Seconds(30)));
  auto comm = NcclCommunicator::Create(rendezvous, NcclCommunicator::Options());
  ASSERT_TRUE(comm.ok()) << comm.status();
  NcclCommunicator& world = **comm;
  EXPECT_EQ(world.device(), 0);
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);

  at::Tensor b = at::arange(16, cuda.dtype(at::kFloat));
  ASSERT_TRUE(world.Broadcast(b, 0).ok());
  EXPECT_TRUE(at::equal(b.cpu(), at::arange(16, at::kFloat)));

  at::Tensor s = at::full({4}, 2.5, cuda.dtype(at::kDouble));
  ASSERT_TRUE(world.AllReduceSum(s).ok());
  EXPECT_TRUE(at::equal(s.cpu(), at::full({4}, 2.5, at::kDouble)));

  auto gathered = world.AllGather(at::arange(3, cuda.dtype(at::kLong)));
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  ASSERT_EQ(gathered->size(), 1u);
  EXPECT_TRUE((*gathered)[0].is_cuda());
  EXPECT_TRUE(at::equal((*gathered)[0].cpu(), at::arange(3, at::kLong)));

  // AllGatherThen hands the gathered views on before the wait; its error is the call's.
  std::vector<at::Tensor> copies;
  auto then = world.AllGatherThen(at::arange(5, cuda.dtype(at::kFloat)),
                                  [&](const std::vector<at::Tensor>& all) {
                                    for (const at::Tensor& t : all) copies.push_back(t.clone());
                                    return absl::OkStatus();
                                  });
  ASSERT_TRUE(then.ok()) << then.status();
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_TRUE(at::equal(copies[0].cpu(), at::arange(5, at::kFloat)));
  auto refused = world.AllGatherThen(
      at::arange(5, cuda.dtype(at::kFloat)),
      [](const std::vector<at::Tensor>&) { return absl::DataLossError("then failed"); });
  EXPECT_EQ(refused.status(), absl::DataLossError("then failed"));

  // CPU tensors are staged through the device and copied back.
  at::Tensor cpu = at::full({3}, 7, at::kInt);
  ASSERT_TRUE(world.AllReduceSum(cpu).ok());
  EXPECT_TRUE(cpu.is_cpu());
  EXPECT_TRUE(at::equal(cpu, at::full({3}, 7, at::kInt)));
  std::string bytes = "lockstep";
  ASSERT_TRUE(BroadcastBytes(world, &bytes, 0).ok());
  EXPECT_EQ(bytes, "lockstep");
  // The reused staging buffers grow for a larger tensor and keep working for a smaller one.
  for (int64_t n : {5073, 300000, 17}) {
    at::Tensor staged = at::randint(0, 255, {n}, at::kByte);
    const at::Tensor expected = staged.clone();
    ASSERT_TRUE(world.Broadcast(staged, 0).ok()) << n;
    EXPECT_TRUE(at::equal(staged, expected)) << n;
  }

  ASSERT_TRUE(world.Barrier().ok());
  auto group = world.NewGroup({0});
  ASSERT_TRUE(group.ok()) << group.status();
  at::Tensor g = at::ones({2}, cuda);
  EXPECT_TRUE((*group)->AllReduceSum(g).ok());
  EXPECT_EQ((*group)->DebugName(), "nccl group [0]");
}

TEST(NcclCommunicatorTest, UnsupportedDtypeAndBadRootAreInvalidArgumentsThenUnusable) {
  at::Tensor t = at::zeros({2}, at::TensorOptions().device(at::kCUDA));
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Rendezvous> rendezvous,
                                  FileRendezvous("dtype", 0, 1, absl::Seconds(30)));
    auto comm = NcclCommunicator::Create(rendezvous, NcclCommunicator::Options());
    ASSERT_TRUE(comm.ok()) << comm.status();
    at::Tensor complex =
        at::zeros({2}, at::TensorOptions().dtype(at::kComplexFloat).device(at::kCUDA));
    EXPECT_EQ((*comm)->AllReduceSum(complex).code(), absl::StatusCode::kInvalidArgument);
    // The shared contract: after an error the communicator is unusable.
    const absl::Status after = (*comm)->Broadcast(t, 0);
    EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition) << after;
    EXPECT_THAT(after.message(), HasSubstr("unusable after an earlier error"));
  }
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Rendezvous> rendezvous,
                                FileRendezvous("root", 0, 1, absl::Seconds(30)));
  auto comm = NcclCommunicator::Create(rendezvous, NcclCommunicator::Options());
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_THAT((*comm)->Broadcast(t, 1).message(), HasSubstr("root is outside [0, 1)"));
}

TEST(NcclCommunicatorTest, DeviceThatDoesNotExistIsNamed) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Rendezvous> rendezvous,
                                FileRendezvous("device", 0, 1, absl::Seconds(30)));
  NcclCommunicator::Options options;
  options.device = 99;
  auto comm = NcclCommunicator::Create(rendezvous, options);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(comm.status().message(), HasSubstr("device 99 selects CUDA device 99"));
}

TEST(NcclCommunicatorTest, PeerMissingAtRendezvousIsNamedWithinTheTimeout) {
  // Rank 0 of a world of 2 whose rank 1 never comes: the rendezvous fails within its timeout.
  const Stopwatch start;
  auto rendezvous = Rendezvous::File(StorePath("absent"), 0, 2, absl::Seconds(3));
  EXPECT_EQ(rendezvous.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(rendezvous.status().message(), HasSubstr("missing rank(s) 1"));
  EXPECT_LT(start.Elapsed(), absl::Seconds(3 + 10));
}

TEST(NcclCommunicatorTest, PeerThatNeverCreatesItsCommunicatorTimesOutInsteadOfHanging) {
  // Rank 1 arrives at the rendezvous but never creates its NCCL communicator: rank 0's creation
  // must fail within the timeout, naming the world.
  absl::StatusOr<std::shared_ptr<Rendezvous>> peer;
  std::thread peer_thread([&peer] { peer = FileRendezvous("silent", 1, 2, absl::Seconds(30)); });
  absl::StatusOr<std::shared_ptr<Rendezvous>> rendezvous =
      FileRendezvous("silent", 0, 2, absl::Seconds(30));
  peer_thread.join();
  ASSERT_TRUE(rendezvous.ok()) << rendezvous.status();
  ASSERT_TRUE(peer.ok()) << peer.status();
  NcclCommunicator::Options options;
  options.timeout = absl::Seconds(3);
  const Stopwatch start;
  auto comm = NcclCommunicator::Create(*rendezvous, options);
  const absl::Duration took = start.Elapsed();
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_THAT(comm.status().message(), HasSubstr("creating nccl world [0, 1]"));
  EXPECT_LT(took, absl::Seconds(3 + 10));
}

}  // namespace
}  // namespace collectives
}  // namespace lockstep
