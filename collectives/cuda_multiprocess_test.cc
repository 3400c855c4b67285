// gpu: collectives across processes with CUDA and CPU tensors, checking the bytes that arrive,
// not only statuses.
// - Two processes sharing one GPU talk through Gloo, which accepts CUDA tensors (NCCL refuses
//   two ranks on one GPU).
// - NCCL across GPUs: one process per GPU, all the GPUs the machine has; skipped, with the GPU
//   count, when it has fewer than 2. CPU tensors go through both staging modes (mapped host
//   memory and device copies), many times with changing roots and sizes, since a staging race
//   shows as stale bytes, not as an error.
#include <unistd.h>

#include <string>
#include <tuple>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "base/stopwatch.h"
#include "collectives/nccl_communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/collective_calls.h"
#include "testing/nccl_world.h"
#include "testing/process_world.h"

namespace lockstep {
namespace collectives {
namespace {

absl::Status Expect(bool condition, const std::string& what) {
  return condition ? absl::OkStatus() : absl::InternalError(what);
}

void ExpectAllOk(const std::vector<absl::Status>& results) {
  ASSERT_FALSE(results.empty());
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  }
}

TEST(GlooCudaTest, TwoProcessesSharingOneGpuExchangeCudaTensors) {
  ProcessWorldOptions two;
  two.world_size = 2;
  std::vector<absl::Status> results =
      RunProcessWorld(two, [](int rank, Communicator& world) -> absl::Status {
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
  ExpectAllOk(results);
}

// Bytes root `root` sends in round `round`: distinct per root, round and position.
at::Tensor Pattern(int64_t n, int root, int round) {
  return (at::arange(n, at::kLong) * 7 + root * 131 + round * 31).remainder(251).to(at::kByte);
}

absl::Status CpuCollectivesRound(NcclCommunicator& world, int rank, int round) {
  const int n = world.size();
  const int64_t sizes[] = {1, 17, 5073, 65536, 1 << 20};
  const int64_t bytes = sizes[round % 5];
  const int root = round % n;
  const std::string where = absl::StrCat("round ", round, " (", bytes, " bytes, root ", root, ")");
  // Broadcast: non-roots start from stale bytes that must be overwritten.
  at::Tensor b = rank == root ? Pattern(bytes, root, round) : at::full({bytes}, 0xee, at::kByte);
  LOCKSTEP_RETURN_IF_ERROR(world.Broadcast(b, root));
  LOCKSTEP_RETURN_IF_ERROR(
      Expect(at::equal(b, Pattern(bytes, root, round)), "CPU broadcast content, " + where));
  // All-reduce: every rank contributes rank + round + index.
  at::Tensor s = at::arange(64, at::kDouble) + (rank + round);
  LOCKSTEP_RETURN_IF_ERROR(world.AllReduceSum(s));
  const at::Tensor expected_sum = at::arange(64, at::kDouble) * n + (n * (n - 1) / 2.0 + n * round);
  LOCKSTEP_RETURN_IF_ERROR(Expect(at::equal(s, expected_sum), "CPU all-reduce content, " + where));
  // All-gather: member m's tensor is its pattern.
  const int64_t g = 1 + bytes % 4099;
  absl::StatusOr<std::vector<at::Tensor>> gathered = world.AllGather(Pattern(g, rank, round));
  if (!gathered.ok()) return gathered.status();
  LOCKSTEP_RETURN_IF_ERROR(Expect(static_cast<int>(gathered->size()) == n, "all-gather count"));
  for (int m = 0; m < n; ++m) {
    LOCKSTEP_RETURN_IF_ERROR(Expect((*gathered)[m].is_cpu(), "all-gather left the CPU"));
    LOCKSTEP_RETURN_IF_ERROR(Expect(at::equal((*gathered)[m], Pattern(g, m, round)),
                                    absl::StrCat("CPU all-gather member ", m, ", ", where)));
  }
  return absl::OkStatus();
}

// The three paths a CPU tensor can take between GPUs of one host: the host lane (small tensors;
// larger ones still go through NCCL, zero-copy), NCCL zero-copy, NCCL with staging copies.
struct CpuPath {
  const char* name;
  NcclCommunicator::CpuStaging staging;
  bool host_lane;
};

class NcclStaging : public ::testing::TestWithParam<CpuPath> {};

TEST_P(NcclStaging, CpuTensorsReachEveryGpuIntact) {
  NcclWorldOptions options;
  options.cpu_staging = GetParam().staging;
  options.host_lane = GetParam().host_lane;
  const bool host_lane = GetParam().host_lane;
  NcclWorldResult result = RunNcclWorld(options, [host_lane](int rank, NcclCommunicator& world) {
    // The path under test is the one taken: all GPUs of this machine share its host.
    LOCKSTEP_RETURN_IF_ERROR(
        Expect(world.uses_host_lane() == host_lane, "the host lane is not as configured"));
    for (int round = 0; round < 200; ++round) {
      LOCKSTEP_RETURN_IF_ERROR(CpuCollectivesRound(world, rank, round));
    }
    return absl::OkStatus();
  });
  if (!result.skip_reason.empty()) GTEST_SKIP() << result.skip_reason;
  ExpectAllOk(result.ranks);
}

INSTANTIATE_TEST_SUITE_P(
    EveryPath, NcclStaging,
    ::testing::Values(CpuPath{"HostLane", NcclCommunicator::CpuStaging::kMappedHost, true},
                      CpuPath{"NcclZeroCopy", NcclCommunicator::CpuStaging::kMappedHost, false},
                      CpuPath{"NcclCopies", NcclCommunicator::CpuStaging::kDeviceCopies, false}),
    [](const ::testing::TestParamInfo<CpuPath>& info) { return std::string(info.param.name); });

TEST(NcclMultiGpuTest, CudaTensorCollectivesAndGroups) {
  NcclWorldResult result =
      RunNcclWorld(NcclWorldOptions(), [](int rank, NcclCommunicator& world) -> absl::Status {
        const int n = world.size();
        const auto cuda = at::TensorOptions().device(at::kCUDA, rank);
        at::Tensor b = at::full({16}, 1.0 + rank, cuda);
        LOCKSTEP_RETURN_IF_ERROR(world.Broadcast(b, n - 1));
        LOCKSTEP_RETURN_IF_ERROR(
            Expect(at::equal(b.cpu(), at::full({16}, 1.0 * n)), "CUDA broadcast"));
        at::Tensor s = at::full({4}, 1.0 + rank, cuda);
        LOCKSTEP_RETURN_IF_ERROR(world.AllReduceSum(s));
        LOCKSTEP_RETURN_IF_ERROR(
            Expect(at::equal(s.cpu(), at::full({4}, n * (n + 1) / 2.0)), "CUDA all-reduce"));
        auto gathered = world.AllGather(at::full({1}, rank, cuda.dtype(at::kLong)));
        if (!gathered.ok()) return gathered.status();
        for (int m = 0; m < n; ++m) {
          LOCKSTEP_RETURN_IF_ERROR(
              Expect((*gathered)[m].item<int64_t>() == m, absl::StrCat("CUDA all-gather ", m)));
        }
        // AllGatherThen: copies `then` queues on the current stream follow the gather (64 MB
        // per GPU, so that a copy racing it would read stale rows).
        const int64_t rows = int64_t{1} << 24;
        std::vector<at::Tensor> copies;
        auto big = world.AllGatherThen(at::full({rows}, 1.0 + rank, cuda),
                                       [&](const std::vector<at::Tensor>& all) {
                                         for (const at::Tensor& t : all)
                                           copies.push_back(t.clone());
                                         return absl::OkStatus();
                                       });
        if (!big.ok()) return big.status();
        for (int m = 0; m < n; ++m) {
          LOCKSTEP_RETURN_IF_ERROR(Expect(at::equal(copies[m], at::full({rows}, 1.0 + m, cuda)),
                                          absl::StrCat("AllGatherThen's copy of member ", m)));
        }
        // A group of the first two GPUs, in reverse order: its leader is GPU 1.
        if (rank < 2) {
          auto group = world.NewGroup({1, 0});
          if (!group.ok()) return group.status();
          at::Tensor t = at::full({3}, 5.0 * rank, cuda);
          LOCKSTEP_RETURN_IF_ERROR((*group)->Broadcast(t, 0));
          LOCKSTEP_RETURN_IF_ERROR(Expect(at::equal(t.cpu(), at::full({3}, 5.0)), "group"));
        }
        return world.Barrier();
      });
  if (!result.skip_reason.empty()) GTEST_SKIP() << result.skip_reason;
  ExpectAllOk(result.ranks);
}

// A peer that dies between collectives: a CUDA tensor (the non-blocking communicator) and a
// small CPU tensor (the fast lane) both fail within the timeout instead of hanging.
class NcclDeadPeer : public ::testing::TestWithParam<bool> {};

TEST_P(NcclDeadPeer, IsAnErrorWithinTheTimeout) {
  const bool cpu = GetParam();
  NcclWorldOptions options;
  options.timeout = absl::Seconds(5);
  NcclWorldResult result =
      RunNcclWorld(options, [cpu](int rank, NcclCommunicator& world) -> absl::Status {
        LOCKSTEP_RETURN_IF_ERROR(world.Barrier());
        if (rank == 1) _exit(0);
        at::Tensor t =
            cpu ? at::zeros({4}) : at::zeros({4}, at::TensorOptions().device(at::kCUDA, rank));
        const Stopwatch start;
        absl::Status s = world.AllReduceSum(t);
        if (s.ok()) return absl::InternalError("all-reduce with a dead peer succeeded");
        const absl::Duration bound = 2 * world.timeout() + absl::Seconds(5);
        if (start.Elapsed() > bound) {
          return absl::InternalError(
              absl::StrCat("the failure took longer than ", absl::FormatDuration(bound)));
        }
        if (s.code() != absl::StatusCode::kDeadlineExceeded &&
            s.code() != absl::StatusCode::kUnavailable) {
          return absl::InternalError(absl::StrCat("unexpected code: ", s.ToString()));
        }
        return absl::OkStatus();
      });
  if (!result.skip_reason.empty()) GTEST_SKIP() << result.skip_reason;
  EXPECT_TRUE(result.ranks[0].ok()) << result.ranks[0];
}

INSTANTIATE_TEST_SUITE_P(CudaAndCpuTensors, NcclDeadPeer, ::testing::Bool());

// Every collective with a peer that is alive but never arrives, on CUDA tensors (NCCL itself
// has no timeout: the communicator's Await is the bound) and small CPU tensors (the host lane):
// kDeadlineExceeded within the communicator's bound.
class NcclLatePeer : public ::testing::TestWithParam<std::tuple<CollectiveCall, bool>> {};

TEST_P(NcclLatePeer, EveryCollectiveIsBoundedByTheCommunicatorsTimeout) {
  const auto [call, cpu] = GetParam();
  NcclWorldOptions options;
  options.timeout = absl::Seconds(2);
  NcclWorldResult result = RunNcclWorld(
      options, [call = call, cpu = cpu](int rank, NcclCommunicator& world) -> absl::Status {
        LOCKSTEP_RETURN_IF_ERROR(world.Barrier());
        if (rank == 1) {
          absl::SleepFor(absl::Seconds(12));  // alive, never calling
          return absl::OkStatus();
        }
        const Stopwatch start;
        const absl::Status s = RunCollectiveCall(
            call, world, cpu ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, rank));
        const absl::Duration bound = 2 * world.timeout() + absl::Seconds(3);
        if (s.ok()) return absl::InternalError("the collective without its peer succeeded");
        if (start.Elapsed() > bound) {
          return absl::InternalError(absl::StrCat("took ", absl::FormatDuration(start.Elapsed()),
                                                  ", more than ", absl::FormatDuration(bound)));
        }
        if (s.code() != absl::StatusCode::kDeadlineExceeded) {
          return absl::InternalError(absl::StrCat("unexpected code: ", s.ToString()));
        }
        return absl::OkStatus();
      });
  if (!result.skip_reason.empty()) GTEST_SKIP() << result.skip_reason;
  EXPECT_TRUE(result.ranks[0].ok()) << CollectiveCallName(call) << ": " << result.ranks[0];
}

INSTANTIATE_TEST_SUITE_P(EveryCollective, NcclLatePeer,
                         ::testing::Combine(::testing::ValuesIn(AllCollectiveCalls()),
                                            ::testing::Bool()));

}  // namespace
}  // namespace collectives
}  // namespace lockstep
