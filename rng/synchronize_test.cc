// Synchronize across real processes (each with its own default generators), over Gloo.
#include "rng/synchronize.h"
#include "base/stopwatch.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectives/topology.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rng/cpu_generator_state.h"
#include "rng/rank_streams.h"
#include "testing/process_world.h"

namespace lockstep {
namespace rng {
namespace {

using collectives::Communicator;
using collectives::Topology;

absl::StatusOr<std::shared_ptr<RankStreams>> Streams() {
  return RankStreams::Create(DefaultGenerators::CpuOnly());
}

collectives::ProcessWorldOptions World(int n) {
  collectives::ProcessWorldOptions options;
  options.world_size = n;
  return options;
}

// What every rank draws after the step under test: uniform numbers, a dropout mask and a
// random token mask, as one tensor.
at::Tensor Draws() {
  at::Tensor uniform = at::rand({16});
  at::Tensor dropout = at::dropout(at::ones({64}), 0.5, /*train=*/true);
  at::Tensor token_mask = at::randint(0, 2, {32}).to(at::kFloat);
  return at::cat({uniform, dropout, token_mask});
}

// Runs a world of `world` processes with TP x CP = tp * cp. Each rank seeds its default
// generator with seed_of(rank), optionally synchronizes its TP x CP group, draws, and
// all-gathers the draws of every rank. Returns, per rank, "ok" or a description of what that
// rank saw; the same on every rank, so rank 0's is checked.
struct Outcome {
  std::vector<absl::Status> statuses;
};

using Check = std::function<absl::Status(const Topology&, const std::vector<at::Tensor>&)>;

std::vector<absl::Status> RunSync(int world, int tp, int cp, std::function<uint64_t(int)> seed_of,
                                  bool synchronize, Check check) {
  return collectives::RunProcessWorld(
      World(world), [=](int rank, Communicator& comm) -> absl::Status {
        absl::StatusOr<Topology> topo = Topology::Create(world, tp, cp);
        if (!topo.ok()) return topo.status();
        auto group = comm.NewGroup(topo->TpCpGroup(rank));
        if (!group.ok()) return group.status();
        at::manual_seed(seed_of(rank));
        (void)at::rand({rank + 1});  // ranks have advanced by different amounts
        if (synchronize) {
          absl::StatusOr<std::shared_ptr<RankStreams>> streams = Streams();
          if (!streams.ok()) return streams.status();
          if (absl::Status s = Synchronize(group->get(), **streams); !s.ok()) return s;
        }
        auto gathered = comm.AllGather(Draws());
        if (!gathered.ok()) return gathered.status();
        return check(*topo, *gathered);
      });
}

absl::Status ReplicasAgreeAndDpWorkers(bool dp_workers_equal, const Topology& topo,
                                       const std::vector<at::Tensor>& draws) {
  for (int r = 0; r < topo.world_size(); ++r) {
    const int leader = Topology::Leader(topo.TpCpGroup(r));
    if (!at::equal(draws[r], draws[leader])) {
      return absl::InternalError(absl::StrCat("rank ", r, " disagrees with its leader ", leader));
    }
  }
  for (int d = 1; d < topo.dp_size(); ++d) {
    const int leader = d * topo.tp_size() * topo.cp_size();
    if (at::equal(draws[leader], draws[0]) != dp_workers_equal) {
      return absl::InternalError(absl::StrCat(
          "DP worker ", d, " is ", dp_workers_equal ? "not " : "", "equal to DP worker 0"));
    }
  }
  return absl::OkStatus();
}

void ExpectAllOk(const std::vector<absl::Status>& results) {
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_TRUE(results[r].ok()) << r << ": " << results[r];
}

TEST(SynchronizeTest, TpTwoReplicasDrawIdenticalNumbersAndMasks) {
  ExpectAllOk(RunSync(
      2, /*tp=*/2, /*cp=*/1, [](int r) { return 100 + r; }, true,
      [](const Topology& t, const std::vector<at::Tensor>& d) {
        return ReplicasAgreeAndDpWorkers(false, t, d);
      }));
}

TEST(SynchronizeTest, DpTwoCpTwoDifferentSeedsStayDifferentAcrossDpWorkers) {
  // Rank 2 leads DP worker 1: its replica (rank 3) must adopt rank 2's state, not rank 0's.
  ExpectAllOk(RunSync(
      4, 1, 2, [](int r) { return 100 + r; }, true,
      [](const Topology& t, const std::vector<at::Tensor>& d) {
        return ReplicasAgreeAndDpWorkers(/*dp_workers_equal=*/false, t, d);
      }));
}

TEST(SynchronizeTest, DpTwoCpTwoIdenticalSeedsStayIdenticalAcrossDpWorkers) {
  // Same seed everywhere, but ranks advanced differently: after the per-DP-worker sync, DP
  // worker 0 has rank 0's state and DP worker 1 rank 2's. Ranks 0 and 2 advanced differently
  // too (by 1 and 3 draws), so for the DP workers to be identical their leaders must be in the
  // same state: make them so by advancing rank 2 like rank 0.
  ExpectAllOk(
      collectives::RunProcessWorld(World(4), [](int rank, Communicator& comm) -> absl::Status {
        absl::StatusOr<Topology> topo = Topology::Create(4, 1, 2);
        if (!topo.ok()) return topo.status();
        auto group = comm.NewGroup(topo->TpCpGroup(rank));
        if (!group.ok()) return group.status();
        at::manual_seed(100);
        (void)at::rand({rank % 2 == 0 ? 1 : 7});  // leaders identical, replicas drifted
        absl::StatusOr<std::shared_ptr<RankStreams>> streams = Streams();
        if (!streams.ok()) return streams.status();
        if (absl::Status s = Synchronize(group->get(), **streams); !s.ok()) return s;
        auto gathered = comm.AllGather(Draws());
        if (!gathered.ok()) return gathered.status();
        return ReplicasAgreeAndDpWorkers(/*dp_workers_equal=*/true, *topo, *gathered);
      }));
}

TEST(SynchronizeTest, NegativeControlWithoutSynchronizeReplicasDisagree) {
  // The check used above must fail when synchronization is disabled.
  std::vector<absl::Status> results = RunSync(
      4, 1, 2, [](int r) { return 100 + r; }, /*synchronize=*/false,
      [](const Topology& t, const std::vector<at::Tensor>& d) {
        return ReplicasAgreeAndDpWorkers(false, t, d);
      });
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
    EXPECT_THAT(s.message(), ::testing::HasSubstr("disagrees with its leader"));
  }
}

// The leader cannot synchronize (here: it is inside a model-stream scope, so its live state is
// not the caller's): it still broadcasts, and every member fails at once naming the leader
// instead of waiting for a broadcast that never comes (the process-world timeout would fire).
TEST(SynchronizeTest, LeaderFailureReachesEveryMemberWithoutAHang) {
  const Stopwatch start;
  std::vector<absl::Status> results =
      collectives::RunProcessWorld(World(3), [](int rank, Communicator& comm) -> absl::Status {
        if (rank == 0) return absl::OkStatus();  // not a member
        auto group = comm.NewGroup({1, 2});      // leader: global rank 1
        if (!group.ok()) return group.status();
        absl::StatusOr<std::shared_ptr<RankStreams>> created = Streams();
        if (!created.ok()) return created.status();
        std::shared_ptr<RankStreams> streams = *std::move(created);
        std::optional<absl::StatusOr<ModelStreamScope>> scope;
        if (rank == 1) scope.emplace(ModelStreamScope::Enter(*streams));
        const absl::Status s = Synchronize(group->get(), *streams);
        if (rank == 1) {
          return s.code() == absl::StatusCode::kFailedPrecondition
                     ? absl::OkStatus()
                     : absl::InternalError(absl::StrCat("the leader got: ", s.ToString()));
        }
        if (s.code() != absl::StatusCode::kFailedPrecondition ||
            !absl::StrContains(s.message(), "leader (global rank 1)")) {
          return absl::InternalError(absl::StrCat("member got: ", s.ToString()));
        }
        return absl::OkStatus();
      });
  ExpectAllOk(results);
  EXPECT_LT(start.Elapsed(), absl::Seconds(20));
}

// A member inside a scope refuses, but only after taking part in the broadcast: the leader
// completes and keeps its state.
TEST(SynchronizeTest, AMemberInsideAScopeRefusesWithoutStrandingTheLeader) {
  ExpectAllOk(
      collectives::RunProcessWorld(World(2), [](int rank, Communicator& comm) -> absl::Status {
        at::manual_seed(40 + rank);
        absl::StatusOr<std::shared_ptr<RankStreams>> created = Streams();
        if (!created.ok()) return created.status();
        std::shared_ptr<RankStreams> streams = *std::move(created);
        std::optional<absl::StatusOr<ModelStreamScope>> scope;
        if (rank == 1) scope.emplace(ModelStreamScope::Enter(*streams));
        const absl::Status s = Synchronize(&comm, *streams);
        if (rank == 0) return s;
        if (s.code() != absl::StatusCode::kFailedPrecondition ||
            !absl::StrContains(s.message(), "model-stream scope or named-stream fork is active")) {
          return absl::InternalError(absl::StrCat("member got: ", s.ToString()));
        }
        return absl::OkStatus();
      }));
}

TEST(SynchronizeTest, NoGroupAndSingleMemberGroupAreNoOps) {
  ExpectAllOk(
      collectives::RunProcessWorld(World(2), [](int rank, Communicator& comm) -> absl::Status {
        at::manual_seed(7 + rank);
        absl::StatusOr<RngSnapshot> before = RngSnapshot::Capture({});
        if (!before.ok()) return before.status();
        absl::StatusOr<std::shared_ptr<RankStreams>> streams = Streams();
        if (!streams.ok()) return streams.status();
        if (absl::Status s = Synchronize(nullptr, **streams); !s.ok()) return s;
        auto alone = comm.NewGroup({rank});
        if (!alone.ok()) return alone.status();
        if (absl::Status s = Synchronize(alone->get(), **streams); !s.ok()) return s;
        absl::StatusOr<RngSnapshot> after = RngSnapshot::Capture({});
        if (!after.ok()) return after.status();
        if (*after != *before) return absl::InternalError("state changed");
        return absl::OkStatus();
      }));
}

TEST(SynchronizeTest, ModelStreamsDerivedAfterSyncAgreeAcrossReplicas) {
  // The model stream is derived from the caller state, so synchronized callers derive the same
  // model stream and the model's dropout masks agree across replicas too.
  ExpectAllOk(
      collectives::RunProcessWorld(World(2), [](int rank, Communicator& comm) -> absl::Status {
        at::manual_seed(500 + rank);
        absl::StatusOr<std::shared_ptr<RankStreams>> created = Streams();
        if (!created.ok()) return created.status();
        std::shared_ptr<RankStreams> streams = *std::move(created);
        if (absl::Status s = Synchronize(&comm, *streams); !s.ok()) return s;
        at::Tensor mask;
        {
          absl::StatusOr<ModelStreamScope> scope = ModelStreamScope::Enter(*streams);
          if (!scope.ok()) return scope.status();
          mask = at::dropout(at::ones({128}), 0.25, true);
        }
        auto gathered = comm.AllGather(mask);
        if (!gathered.ok()) return gathered.status();
        if (!at::equal((*gathered)[0], (*gathered)[1]))
          return absl::InternalError("model masks differ");
        return absl::OkStatus();
      }));
}

TEST(SynchronizeWireBytesTest, CompactCpuStateThenCudaSeedAndOffsetThenStatus) {
  EXPECT_EQ(SynchronizeWireBytes(DefaultGenerators::CpuOnly()), kCompactCpuStateBytes + 1);
  EXPECT_EQ(SynchronizeWireBytes(DefaultGenerators::WithCudaDevice(3)),
            kCompactCpuStateBytes + 16 + 1);
  EXPECT_EQ(kCompactCpuStateBytes, 2526u);
}

}  // namespace
}  // namespace rng
}  // namespace lockstep
