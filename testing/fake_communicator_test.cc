#include "testing/fake_communicator.h"

#include "testing/collective_calls.h"

#include <atomic>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status_testutil.h"
#include "base/stopwatch.h"
#include "collectives/topology.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace collectives {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

void ExpectAllOk(const std::vector<absl::Status>& results) {
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_TRUE(results[r].ok()) << r << ": " << results[r];
}

class FakeWorldSizes : public ::testing::TestWithParam<int> {};

TEST_P(FakeWorldSizes, BroadcastCopiesTheRootTensorFromANonzeroRoot) {
  const int n = GetParam();
  FakeWorld world(n);
  ExpectAllOk(world.Run([n](collectives::Communicator& comm) -> absl::Status {
    at::Tensor t = at::full({3}, comm.rank() * 10.0, at::kFloat);
    const int root = n - 1;
    if (auto s = comm.Broadcast(t, root); !s.ok()) return s;
    if (!at::equal(t, at::full({3}, root * 10.0, at::kFloat))) {
      return absl::InternalError(absl::StrCat("rank ", comm.rank(), " got wrong values"));
    }
    return absl::OkStatus();
  }));
}

TEST_P(FakeWorldSizes, AllGatherReturnsEveryMembersInputInRankOrder) {
  FakeWorld world(GetParam());
  ExpectAllOk(world.Run([](collectives::Communicator& comm) -> absl::Status {
    at::Tensor mine = at::arange(4, at::kLong) + 100 * comm.rank();
    auto gathered = comm.AllGather(mine);
    if (!gathered.ok()) return gathered.status();
    if (static_cast<int>(gathered->size()) != comm.size()) return absl::InternalError("count");
    for (int m = 0; m < comm.size(); ++m) {
      if (!at::equal((*gathered)[m], at::arange(4, at::kLong) + 100 * m)) {
        return absl::InternalError(absl::StrCat("member ", m, " wrong"));
      }
    }
    return absl::OkStatus();
  }));
}

// Where the gather completes before returning, `then` sees the gathered tensors, and its error
// is the call's.
TEST_P(FakeWorldSizes, AllGatherThenHandsTheGatheredTensorsOnAndReturnsItsError) {
  FakeWorld world(GetParam());
  ExpectAllOk(world.Run([](collectives::Communicator& comm) -> absl::Status {
    at::Tensor mine = at::full({3}, comm.rank() + 1.0, at::kFloat);
    at::Tensor sum = at::zeros({3}, at::kFloat);
    auto gathered = comm.AllGatherThen(mine, [&](const std::vector<at::Tensor>& all) {
      for (const at::Tensor& t : all) sum.add_(t);
      return absl::OkStatus();
    });
    if (!gathered.ok()) return gathered.status();
    const int n = comm.size();
    if (!at::equal(sum, at::full({3}, n * (n + 1) / 2.0, at::kFloat))) {
      return absl::InternalError("then did not see every member's input");
    }
    auto refused = comm.AllGatherThen(
        mine, [](const std::vector<at::Tensor>&) { return absl::DataLossError("then failed"); });
    if (refused.status() != absl::DataLossError("then failed")) {
      return absl::InternalError(
          absl::StrCat("then's error was not returned: ", refused.status().ToString()));
    }
    return absl::OkStatus();
  }));
}

TEST_P(FakeWorldSizes, AllReduceSumsInPlace) {
  const int n = GetParam();
  FakeWorld world(n);
  ExpectAllOk(world.Run([n](collectives::Communicator& comm) -> absl::Status {
    at::Tensor t = at::full({5}, comm.rank() + 1.0, at::kDouble);
    if (auto s = comm.AllReduceSum(t); !s.ok()) return s;
    if (!at::equal(t, at::full({5}, n * (n + 1) / 2.0, at::kDouble))) {
      return absl::InternalError("wrong sum");
    }
    return comm.Barrier();
  }));
  EXPECT_EQ(world.completed_collectives(), 2);
}

TEST_P(FakeWorldSizes, BarrierWaitsForTheLateRank) {
  const int n = GetParam();
  FakeWorld world(n, {absl::Seconds(5)});
  world.InjectDelay(n - 1, 0, absl::Milliseconds(300));
  std::vector<absl::Duration> waited(n);
  ExpectAllOk(world.Run([&](collectives::Communicator& comm) {
    const Stopwatch start;
    absl::Status s = comm.Barrier();
    waited[comm.rank()] = start.Elapsed();
    return s;
  }));
  for (int r = 0; r < n; ++r) EXPECT_GE(waited[r], absl::Milliseconds(250)) << r;
}

INSTANTIATE_TEST_SUITE_P(TwoAndFourRanks, FakeWorldSizes, ::testing::Values(2, 4));

TEST(FakeWorldTest, SubGroupsOfADpTwoCpTwoTopologyStayApart) {
  FakeWorld world(4);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const collectives::Topology topo,
                                collectives::Topology::Create(4, /*tp=*/1, /*cp=*/2));
  std::vector<double> got(4);
  ExpectAllOk(world.Run([&](collectives::Communicator& comm) -> absl::Status {
    auto cp = comm.NewGroup(topo.CpGroup(comm.rank()));
    if (!cp.ok()) return cp.status();
    at::Tensor t = at::full({1}, 1.0 + comm.rank(), at::kDouble);
    if (auto s = (*cp)->Broadcast(t, 0); !s.ok()) return s;
    got[comm.rank()] = t.item<double>();
    if ((*cp)->global_ranks() != topo.CpGroup(comm.rank())) return absl::InternalError("ranks");
    return absl::OkStatus();
  }));
  // The CP group of ranks 2 and 3 is led by global rank 2, not 0.
  EXPECT_EQ(got, (std::vector<double>{1, 1, 3, 3}));
}

TEST(FakeWorldTest, DeadPeerGivesUnavailableNamingItWellWithinTheTimeout) {
  FakeWorld world(4, {absl::Seconds(30)});
  world.InjectFailure(/*rank=*/2, /*call_index=*/1);
  const Stopwatch start;
  std::vector<absl::Status> results = world.Run([](collectives::Communicator& comm) {
    if (auto s = comm.Barrier(); !s.ok()) return s;
    at::Tensor t = at::zeros({2});
    return comm.AllReduceSum(t);
  });
  EXPECT_LT(start.Elapsed(), absl::Seconds(5));
  EXPECT_EQ(results[2].code(), absl::StatusCode::kAborted);
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kUnavailable) << results[r];
    EXPECT_THAT(results[r].message(), AllOf(HasSubstr("[2]"), HasSubstr("all_reduce_sum")));
  }
}

TEST(FakeWorldTest, RankLaterThanTheTimeoutGivesDeadlineExceededNamingIt) {
  FakeWorld world(3, {absl::Milliseconds(200)});
  world.InjectDelay(1, 0, absl::Milliseconds(800));
  const Stopwatch start;
  std::vector<absl::Status> results =
      world.Run([](collectives::Communicator& comm) { return comm.Barrier(); });
  for (int r : {0, 2}) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kDeadlineExceeded) << results[r];
    EXPECT_THAT(results[r].message(), AllOf(HasSubstr("[1] did not arrive"), HasSubstr("barrier")));
  }
  // Bounded by the delay, not by anything longer.
  EXPECT_LT(start.Elapsed(), absl::Seconds(3));
}

// Every collective, a peer later than the timeout: kDeadlineExceeded naming it, within the
// timeout (plus slack), long before the late peer arrives.
TEST(FakeWorldTest, EveryCollectiveWithALatePeerIsBoundedByTheTimeout) {
  for (CollectiveCall call : AllCollectiveCalls()) {
    SCOPED_TRACE(CollectiveCallName(call));
    FakeWorld world(3, {absl::Milliseconds(300)});
    world.InjectDelay(1, 0, absl::Seconds(2));
    std::vector<absl::Duration> took(3);
    std::vector<absl::Status> results = world.Run([&](collectives::Communicator& comm) {
      const Stopwatch start;
      absl::Status s = RunCollectiveCall(call, comm, c10::Device(c10::kCPU));
      took[comm.rank()] = start.Elapsed();
      return s;
    });
    for (int r : {0, 2}) {
      EXPECT_EQ(results[r].code(), absl::StatusCode::kDeadlineExceeded) << results[r];
      EXPECT_THAT(std::string(results[r].message()), HasSubstr("[1] did not arrive"));
      EXPECT_LT(took[r], absl::Seconds(1.5)) << "rank " << r;
    }
  }
}

TEST(FakeWorldTest, MismatchedCollectiveIsNamedWithRanksAndOperations) {
  FakeWorld world(2, {absl::Seconds(5)});
  world.InjectSubstitute(1, 0, [](collectives::Communicator& comm) {
    at::Tensor t = at::zeros({4});
    return comm.AllReduceSum(t);
  });
  std::vector<absl::Status> results = world.Run([](collectives::Communicator& comm) {
    at::Tensor t = at::zeros({4});
    return comm.Broadcast(t, 0);
  });
  for (int r : {0, 1}) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << results[r];
    EXPECT_THAT(results[r].message(), AllOf(HasSubstr("mismatched collectives"),
                                            HasSubstr("rank 0 called broadcast(root=0"),
                                            HasSubstr("rank 1 called all_reduce_sum(Float[4])")));
  }
}

TEST(FakeWorldTest, SameOperationWithDifferentArgumentsIsAMismatch) {
  FakeWorld world(2, {absl::Seconds(5)});
  std::vector<absl::Status> results = world.Run([](collectives::Communicator& comm) {
    at::Tensor t = at::zeros({comm.rank() == 0 ? 4 : 5});
    return comm.AllReduceSum(t);
  });
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("Float[4]"), HasSubstr("Float[5]")));
  }
}

TEST(FakeWorldTest, BadRootAndBadGroupsAreInvalidArguments) {
  FakeWorld world(2);
  ExpectAllOk(world.Run([](collectives::Communicator& comm) {
    at::Tensor t = at::zeros({1});
    absl::Status root = comm.Broadcast(t, 2);
    if (root.code() != absl::StatusCode::kInvalidArgument) return absl::InternalError("root");
    return absl::OkStatus();
  }));
  ExpectAllOk(world.Run([](collectives::Communicator& comm) {
    if (comm.NewGroup({1 - comm.rank()}).status().code() != absl::StatusCode::kInvalidArgument)
      return absl::InternalError("non-member group");
    if (comm.NewGroup({0, 0}).status().code() != absl::StatusCode::kInvalidArgument)
      return absl::InternalError("duplicate group");
    if (comm.NewGroup({0, 1, 2}).status().code() != absl::StatusCode::kInvalidArgument)
      return absl::InternalError("out of world");
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace collectives
}  // namespace lockstep
