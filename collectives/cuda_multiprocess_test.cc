// gpu: collectives across processes with CUDA tensors.
// - Two processes sharing one GPU talk through Gloo, which accepts CUDA tensors (NCCL refuses
//   two ranks on one GPU).
// - NCCL across GPUs: one process per GPU; skipped, with the GPU count, when fewer than 2.
#include <unistd.h>

#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "collectives/nccl_communicator.h"
#include "collectives/process_world.h"
#include "collectives/rendezvous.h"
#include "cuda_runtime_api.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace collectives {
namespace {

using ::testing::AnyOf;

absl::Status Expect(bool condition, const std::string& what) {
  return condition ? absl::OkStatus() : absl::InternalError(what);
}

// A rank's verdict that the machine lacks GPUs for the test; the parent turns it into a skip.
constexpr char kNeedsGpus[] = "needs at least 2 GPUs; this machine has ";

absl::Status RequireGpus(int n) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (count < n) return absl::UnimplementedError(absl::StrCat(kNeedsGpus, count));
  return absl::OkStatus();
}

bool SkipIfTooFewGpus(const std::vector<absl::Status>& results, std::string* why) {
  for (const absl::Status& s : results) {
    if (s.code() == absl::StatusCode::kUnimplemented &&
        s.message().find(kNeedsGpus) != absl::string_view::npos) {
      *why = std::string(s.message());
      return true;
    }
  }
  return false;
}

// Rank `rank` of a 2-process NCCL world on GPU `rank`, through a FileStore at `path`.
absl::StatusOr<std::unique_ptr<NcclCommunicator>> JoinOnOwnGpu(const std::string& path, int rank,
                                                               absl::Duration timeout) {
  auto rendezvous = Rendezvous::File(path, rank, 2, absl::Seconds(30));
  if (!rendezvous.ok()) return rendezvous.status();
  NcclCommunicator::Options options;
  options.device = rank;
  options.timeout = timeout;
  return NcclCommunicator::Create(*rendezvous, options);
}

TEST(GlooCudaTest, TwoProcessesSharingOneGpuExchangeCudaTensors) {
  std::vector<absl::Status> results =
      collectives::RunProcessWorld({2}, [](int rank, Communicator& world) -> absl::Status {
        const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
        at::Tensor b = at::full({1024}, 10.0 * rank, cuda.dtype(at::kFloat));
        LOCKSTEP_RETURN_IF_ERROR(world.Broadcast(b, 1));
        LOCKSTEP_RETURN_IF_ERROR(Expect(b.is_cuda(), "broadcast left the device"));
        LOCKSTEP_RETURN_IF_ERROR(
            Expect(at::equal(b.cpu(), at::full({1024}, 10.0, at::kFloat)), "broadcast"));
        at::Tensor s = at::full({8}, rank + 1.0, cuda.dtype(at::kDouble));
        LOCKSTEP_RETURN_IF_ERROR(world.AllReduceSum(s));
        LOCKSTEP_RETURN_IF_ERROR(
            Expect(at::equal(s.cpu(), at::full({8}, 3.0, at::kDouble)), "all-reduce"));
        auto gathered = world.AllGather(at::full({2}, rank, cuda.dtype(at::kLong)));
        if (!gathered.ok()) return gathered.status();
        for (int m = 0; m < 2; ++m) {
          LOCKSTEP_RETURN_IF_ERROR(
              Expect(at::equal((*gathered)[m].cpu(), at::full({2}, m, at::kLong)),
                     absl::StrCat("all-gather member ", m)));
        }
        // The RNG-state sized payload of the spec: CPU + CUDA generator state, as CUDA bytes.
        at::Tensor state = at::full({5072}, rank == 0 ? 3 : 0, cuda.dtype(at::kByte));
        LOCKSTEP_RETURN_IF_ERROR(world.Broadcast(state, 0));
        return Expect(state.sum().item<int64_t>() == 3 * 5072, "state broadcast");
      });
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_TRUE(results[r].ok()) << r << ": " << results[r];
}

TEST(NcclMultiGpuTest, OneProcessPerGpuAllCollectives) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/nccl_multi_", getpid(), "_store");
  std::vector<absl::Status> results =
      collectives::RunProcessWorld({2}, [&path](int rank, Communicator&) -> absl::Status {
        LOCKSTEP_RETURN_IF_ERROR(RequireGpus(2));
        auto comm = JoinOnOwnGpu(path, rank, absl::Seconds(30));
        if (!comm.ok()) return comm.status();
        const auto cuda = at::TensorOptions().device(at::kCUDA, rank);
        at::Tensor b = at::full({16}, 1.0 + rank, cuda);
        LOCKSTEP_RETURN_IF_ERROR((*comm)->Broadcast(b, 1));
        LOCKSTEP_RETURN_IF_ERROR(Expect(at::equal(b.cpu(), at::full({16}, 2.0)), "broadcast"));
        at::Tensor s = at::full({4}, 1.0 + rank, cuda);
        LOCKSTEP_RETURN_IF_ERROR((*comm)->AllReduceSum(s));
        LOCKSTEP_RETURN_IF_ERROR(Expect(at::equal(s.cpu(), at::full({4}, 3.0)), "all-reduce"));
        auto gathered = (*comm)->AllGather(at::full({1}, rank, cuda.dtype(at::kLong)));
        if (!gathered.ok()) return gathered.status();
        LOCKSTEP_RETURN_IF_ERROR(Expect((*gathered)[1].item<int64_t>() == 1, "all-gather"));
        auto group = (*comm)->NewGroup({1, 0});
        if (!group.ok()) return group.status();
        return (*group)->Barrier();
      });
  std::string why;
  if (SkipIfTooFewGpus(results, &why)) GTEST_SKIP() << "NCCL across GPUs: " << why;
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_TRUE(results[r].ok()) << r << ": " << results[r];
}

TEST(NcclMultiGpuTest, DeadPeerIsAnErrorWithinTheTimeout) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/nccl_dead_", getpid(), "_store");
  std::vector<absl::Status> results =
      collectives::RunProcessWorld({2}, [&path](int rank, Communicator&) -> absl::Status {
        LOCKSTEP_RETURN_IF_ERROR(RequireGpus(2));
        auto comm = JoinOnOwnGpu(path, rank, absl::Seconds(5));
        if (!comm.ok()) return comm.status();
        LOCKSTEP_RETURN_IF_ERROR((*comm)->Barrier());
        if (rank == 1) _exit(0);
        at::Tensor t = at::zeros({4}, at::TensorOptions().device(at::kCUDA, rank));
        const absl::Time start = absl::Now();
        absl::Status s = (*comm)->AllReduceSum(t);
        if (s.ok()) return absl::InternalError("all-reduce with a dead peer succeeded");
        if (absl::Now() - start > absl::Seconds(15)) return absl::InternalError("too slow");
        return absl::OkStatus();
      });
  std::string why;
  if (SkipIfTooFewGpus(results, &why)) GTEST_SKIP() << "NCCL across GPUs: " << why;
  EXPECT_TRUE(results[0].ok()) << results[0];
}

}  // namespace
}  // namespace collectives
}  // namespace lockstep
