// RankGroups on the thread fake world: each rank's groups are the topology's rank lists (against
// lists written out by hand for DP2 x CP2 in Megatron's order), a dimension of size 1 has no
// group to run collectives over, and a world that does not match the topology is refused.

#include "collectives/rank_groups.h"

#include <vector>

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "base/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fake_communicator.h"

namespace lockstep {
namespace collectives {
namespace {

using ::testing::ElementsAreArray;

TEST(RankGroupsTest, EachRanksGroupsAreItsTopologyListsInDp2Cp2) {
  // Ranks in (dp, cp) order, TP 1: rank = dp * 2 + cp.
  const std::vector<std::vector<int>> cp_groups = {{0, 1}, {0, 1}, {2, 3}, {2, 3}};
  const std::vector<std::vector<int>> dp_groups = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
  FakeWorld world(4);
  std::vector<absl::Status> results = world.Run([&](Communicator& comm) -> absl::Status {
    LOCKSTEP_ASSIGN_OR_RETURN(Topology topology, Topology::Create(4, /*tp_size=*/1, /*cp_size=*/2));
    LOCKSTEP_ASSIGN_OR_RETURN(RankGroups groups, RankGroups::CreateBorrowing(comm, topology));
    const int r = comm.rank();
    EXPECT_EQ(groups.rank(), r);
    EXPECT_EQ(&groups.world(), &comm);
    EXPECT_EQ(groups.coordinates().dp, r / 2);
    EXPECT_EQ(groups.coordinates().cp, r % 2);
    EXPECT_THAT(groups.cp()->global_ranks(), ElementsAreArray(cp_groups[r]));
    EXPECT_THAT(groups.tp_cp()->global_ranks(), ElementsAreArray(cp_groups[r]));
    EXPECT_THAT(groups.dp()->global_ranks(), ElementsAreArray(dp_groups[r]));
    EXPECT_THAT(groups.tp()->global_ranks(), ElementsAreArray({r}));
    // TP 1: no TP collectives; CP and DP have other members.
    EXPECT_EQ(groups.tp_or_null(), nullptr);
    EXPECT_EQ(groups.cp_or_null(), groups.cp().get());
    EXPECT_EQ(groups.dp_or_null(), groups.dp().get());
    EXPECT_EQ(groups.replicas(), groups.tp_cp().get());
    EXPECT_EQ(groups.replica_leader(), cp_groups[r].front());
    // The groups work: the CP group's sum is over its two members.
    at::Tensor one = at::ones({1});
    LOCKSTEP_RETURN_IF_ERROR(groups.cp()->AllReduceSum(one));
    EXPECT_EQ(one.item<float>(), 2.0f);
    return absl::OkStatus();
  });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

TEST(RankGroupsTest, AGroupOfOneIsNoGroup) {
  FakeWorld world(2);
  std::vector<absl::Status> results = world.Run([&](Communicator& comm) -> absl::Status {
    // DP 2: every rank is its own TP x CP group, so it has no replicas.
    LOCKSTEP_ASSIGN_OR_RETURN(Topology topology, Topology::Create(2, 1, 1));
    LOCKSTEP_ASSIGN_OR_RETURN(RankGroups groups, RankGroups::CreateBorrowing(comm, topology));
    EXPECT_EQ(groups.replicas(), nullptr);
    EXPECT_EQ(groups.cp_or_null(), nullptr);
    EXPECT_EQ(groups.tp_or_null(), nullptr);
    EXPECT_NE(groups.dp_or_null(), nullptr);
    EXPECT_EQ(groups.replica_leader(), comm.rank());
    return absl::OkStatus();
  });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(WithOthers(static_cast<Communicator*>(nullptr)), nullptr);
}

TEST(RankGroupsTest, AWorldOfAnotherSizeIsRefusedNamingBoth) {
  FakeWorld world(2);
  std::vector<absl::Status> results = world.Run([&](Communicator& comm) -> absl::Status {
    LOCKSTEP_ASSIGN_OR_RETURN(Topology topology, Topology::Create(4, 1, 2));
    absl::StatusOr<RankGroups> groups = RankGroups::CreateBorrowing(comm, topology);
    EXPECT_EQ(groups.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(groups.status().message()), ::testing::HasSubstr("4 ranks"));
    EXPECT_THAT(std::string(groups.status().message()), ::testing::HasSubstr("has 2"));
    return absl::OkStatus();
  });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(RankGroups::Create(nullptr, *Topology::Create(1, 1, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace collectives
}  // namespace lockstep
