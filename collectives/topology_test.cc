#include "collectives/topology.h"

#include <algorithm>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace collectives {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Independent oracle: the coordinates of a rank by counting through Megatron's order (TP
// fastest, then CP, then DP) rather than by division.
std::vector<Coordinates> EnumerateInMegatronOrder(int dp, int tp, int cp) {
  std::vector<Coordinates> order;
  for (int d = 0; d < dp; ++d)
    for (int c = 0; c < cp; ++c)
      for (int t = 0; t < tp; ++t) order.push_back({d, c, t});
  return order;
}

template <typename Pred>
std::vector<int> RanksWhere(const std::vector<Coordinates>& order, Pred pred) {
  std::vector<int> ranks;
  for (int r = 0; r < static_cast<int>(order.size()); ++r)
    if (pred(order[r])) ranks.push_back(r);
  return ranks;
}

TEST(TopologyTest, EveryWorldUpTo16AndEveryFactorization) {
  int factorizations = 0;
  for (int world = 1; world <= 16; ++world) {
    for (int tp = 1; tp <= world; ++tp) {
      for (int cp = 1; cp <= world; ++cp) {
        absl::StatusOr<Topology> topo = Topology::Create(world, tp, cp);
        if (world % (tp * cp) != 0) {
          EXPECT_EQ(topo.status().code(), absl::StatusCode::kInvalidArgument)
              << world << " " << tp << " " << cp;
          continue;
        }
        ASSERT_TRUE(topo.ok()) << topo.status();
        ++factorizations;
        const int dp = world / (tp * cp);
        ASSERT_EQ(topo->dp_size(), dp);
        ASSERT_EQ(topo->world_size(), world);
        const std::vector<Coordinates> order = EnumerateInMegatronOrder(dp, tp, cp);
        std::set<int> leaders_tpcp;
        for (int r = 0; r < world; ++r) {
          const Coordinates want = order[r];
          absl::StatusOr<Coordinates> got = topo->CoordinatesOf(r);
          ASSERT_TRUE(got.ok()) << got.status();
          ASSERT_TRUE(*got == want) << "rank " << r << " in " << topo->DebugString();
          LOCKSTEP_ASSERT_OK_AND_ASSIGN(const int global_rank, topo->GlobalRankOf(want));
          ASSERT_EQ(global_rank, r);
          const auto same_tp_group = RanksWhere(
              order, [&](const Coordinates& c) { return c.dp == want.dp && c.cp == want.cp; });
          const auto same_cp_group = RanksWhere(
              order, [&](const Coordinates& c) { return c.dp == want.dp && c.tp == want.tp; });
          const auto same_tpcp_group =
              RanksWhere(order, [&](const Coordinates& c) { return c.dp == want.dp; });
          const auto same_dp_group = RanksWhere(
              order, [&](const Coordinates& c) { return c.cp == want.cp && c.tp == want.tp; });
          ASSERT_EQ(topo->TpGroup(r), same_tp_group);
          ASSERT_EQ(topo->CpGroup(r), same_cp_group);
          ASSERT_EQ(topo->TpCpGroup(r), same_tpcp_group);
          ASSERT_EQ(topo->DpGroup(r), same_dp_group);
          // Every rank is in its own groups, and the groups have the right sizes.
          for (const auto* g : {&same_tp_group, &same_cp_group, &same_tpcp_group, &same_dp_group})
            ASSERT_NE(std::find(g->begin(), g->end(), r), g->end());
          ASSERT_EQ(same_tp_group.size(), static_cast<size_t>(tp));
          ASSERT_EQ(same_cp_group.size(), static_cast<size_t>(cp));
          ASSERT_EQ(same_tpcp_group.size(), static_cast<size_t>(tp * cp));
          ASSERT_EQ(same_dp_group.size(), static_cast<size_t>(dp));
          ASSERT_EQ(Topology::Leader(topo->TpCpGroup(r)), want.dp * tp * cp);
          leaders_tpcp.insert(Topology::Leader(topo->TpCpGroup(r)));
        }
        // One TP x CP group per DP worker.
        ASSERT_EQ(leaders_tpcp.size(), static_cast<size_t>(dp));
      }
    }
  }
  // Sum over world sizes 1..16 of the number of ordered pairs (tp, cp) with tp * cp | world.
  EXPECT_EQ(factorizations, 1 + 3 + 3 + 6 + 3 + 9 + 3 + 10 + 6 + 9 + 3 + 18 + 3 + 9 + 9 + 15);
}

TEST(TopologyTest, HugeSizesAreRefusedWithoutOverflow) {
  // 65536 x 65536 overflows a 32-bit product to 0 (a division by zero before the fix).
  absl::StatusOr<Topology> huge = Topology::Create(1024, 65536, 65536);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(huge.status().message(), ::testing::HasSubstr("= 4294967296 does not divide"));
  EXPECT_THAT(Topology::Create(1 << 21, 1, 1).status().message(),
              ::testing::HasSubstr("exceeds the largest supported world of 1048576"));
  EXPECT_THAT(Topology::CreateExact(4, 2147483647, 2, 2).status().message(),
              ::testing::HasSubstr("= 8589934588 ranks, but the world has 4"));
  EXPECT_TRUE(Topology::Create(kMaxWorldSize, 1 << 10, 1 << 10).ok());
}

TEST(TopologyTest, DpTwoCpTwoGroupsAndNonzeroLeader) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Topology topo, Topology::Create(4, /*tp=*/1, /*cp=*/2));
  EXPECT_THAT(topo.CpGroup(3), ElementsAre(2, 3));
  EXPECT_THAT(topo.DpGroup(3), ElementsAre(1, 3));
  EXPECT_EQ(Topology::Leader(topo.TpCpGroup(3)), 2);
  // A rank outside the world has no groups (and no leader) instead of aborting.
  for (int bad : {-1, 4, 1 << 30}) {
    EXPECT_TRUE(topo.TpGroup(bad).empty());
    EXPECT_TRUE(topo.CpGroup(bad).empty());
    EXPECT_TRUE(topo.TpCpGroup(bad).empty());
    EXPECT_TRUE(topo.DpGroup(bad).empty());
  }
  EXPECT_EQ(Topology::Leader({}), -1);
  EXPECT_EQ(topo.DebugString(), "DP2 x TP1 x CP2");
}

TEST(TopologyTest, RejectsNonPositiveAndNonDividingSizes) {
  for (auto [w, tp, cp] : std::vector<std::tuple<int, int, int>>{
           {0, 1, 1}, {-4, 1, 1}, {4, 0, 1}, {4, 1, 0}, {4, -2, 1}}) {
    absl::Status s = Topology::Create(w, tp, cp).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("must all be positive"));
  }
  absl::Status s = Topology::Create(6, 4, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("does not divide the world size 6"));
  s = Topology::CreateExact(8, 3, 2, 1).status();
  EXPECT_THAT(s.message(), HasSubstr("the world has 8"));
  EXPECT_EQ(Topology::CreateExact(8, 0, 2, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Topology::CreateExact(8, 2, 2, 2).ok());
}

TEST(TopologyTest, OutOfRangeRanksAndCoordinatesAreErrors) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Topology topo, Topology::Create(8, 2, 2));
  EXPECT_THAT(topo.CoordinatesOf(8).status().message(), HasSubstr("rank 8 is outside"));
  EXPECT_EQ(topo.CoordinatesOf(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(topo.GlobalRankOf({2, 0, 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(topo.GlobalRankOf({0, 0, 2}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace collectives
}  // namespace lockstep
