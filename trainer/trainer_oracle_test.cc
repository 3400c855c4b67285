// The trainer's oracle (trainer/testing/oracle.h) on multi-process Gloo worlds: DP1 x CP2,
// DP2 x CP2, TP2 x CP2 and DP2 x TP2 pass every check on every rank; each negative control makes
// the check that targets it fail. And a peer that dies mid-stream is an error, not a hang.

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "collectives/process_world.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rng/rank_streams.h"
#include "trainer/testing/oracle.h"
#include "trainer/trainer_rank.h"

namespace lockstep {
namespace trainer {
namespace {

using ::testing::HasSubstr;

// Runs the oracle on a DP x TP x CP world; per rank, OK when every check passed, otherwise
// kFailedPrecondition listing the failed checks ("name: detail"), or the error.
std::vector<absl::Status> RunOracleWorld(int dp, int tp, int cp, OracleControl control) {
  collectives::ProcessWorldOptions options;
  options.world_size = dp * tp * cp;
  return collectives::RunProcessWorld(
      options, [=](int, collectives::Communicator& world) -> absl::Status {
        absl::StatusOr<collectives::Topology> topology =
            collectives::Topology::CreateExact(world.size(), dp, tp, cp);
        if (!topology.ok()) return topology.status();
        absl::StatusOr<std::vector<OracleCheck>> checks =
            RunTrainerOracle(world, *topology, control);
        if (!checks.ok()) return checks.status();
        std::vector<std::string> failed;
        for (const OracleCheck& c : *checks) {
          if (!c.passed) failed.push_back(absl::StrCat(c.name, ": ", c.detail));
        }
        if (!failed.empty()) return absl::FailedPreconditionError(absl::StrJoin(failed, " | "));
        return absl::OkStatus();
      });
}

void ExpectAllPass(int dp, int tp, int cp) {
  const std::vector<absl::Status> results = RunOracleWorld(dp, tp, cp, OracleControl::kNone);
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].ok()) << "DP" << dp << " x TP" << tp << " x CP" << cp << ", rank " << r
                                 << ": " << results[r];
  }
}

TEST(TrainerOracleTest, Dp1Cp2) { ExpectAllPass(1, 1, 2); }
TEST(TrainerOracleTest, Dp2Cp2) { ExpectAllPass(2, 1, 2); }
TEST(TrainerOracleTest, Tp2Cp2) { ExpectAllPass(1, 2, 2); }
TEST(TrainerOracleTest, Dp2Tp2) { ExpectAllPass(2, 2, 1); }

// The control must make `check` fail on at least one rank, and no rank may error out.
void ExpectDetected(OracleControl control, const std::string& check) {
  const std::vector<absl::Status> results = RunOracleWorld(1, 2, 2, control);
  int detected = 0;
  for (size_t r = 0; r < results.size(); ++r) {
    if (results[r].ok()) continue;
    EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << r << results[r];
    if (absl::StrContains(results[r].message(), check + ":")) {
      if (detected++ == 0)
        std::printf("rank %zu: %s\n", r, std::string(results[r].message()).c_str());
    }
  }
  EXPECT_GT(detected, 0) << "the negative control went undetected by " << check;
}

TEST(TrainerOracleTest, NegativeControlSynchronizationDisabled) {
  ExpectDetected(OracleControl::kNoSync, "caller_draws");
}

TEST(TrainerOracleTest, NegativeControlModelWorkOnTheCallersStream) {
  ExpectDetected(OracleControl::kModelWorkOnCallerStream, "stream_progression");
}

TEST(TrainerOracleTest, NegativeControlInputMaterialisedInsideTheScope) {
  ExpectDetected(OracleControl::kInputInsideScope, "reference_match");
}

TEST(TrainerOracleTest, APeerThatDiesMidStreamIsAnErrorWithinTheTimeout) {
  collectives::ProcessWorldOptions options;
  options.world_size = 2;
  options.collective_timeout = absl::Seconds(4);
  const absl::Time start = absl::Now();
  std::vector<absl::Status> results = collectives::RunProcessWorld(
      options, [](int rank, collectives::Communicator& world) -> absl::Status {
        LOCKSTEP_ASSIGN_OR_RETURN(collectives::Topology topology,
                                  collectives::Topology::CreateExact(2, 1, 1, 2));
        LOCKSTEP_ASSIGN_OR_RETURN(auto group, world.NewGroup(topology.TpCpGroup(rank)));
        LOCKSTEP_ASSIGN_OR_RETURN(auto streams,
                                  rng::RankStreams::Create(rng::DefaultGenerators::CpuOnly()));
        int calls = 0;
        LOCKSTEP_ASSIGN_OR_RETURN(
            auto trainer, TrainerRank::Create(
                              TrainerConfig::Of(8),
                              TrainerRank::Collaborators::Of(topology, rank, group.get(), streams),
                              [&](const ShardWork& work) -> absl::StatusOr<at::Tensor> {
                                if (rank == 1 && ++calls == 2) _exit(3);
                                return work.inputs * 2;
                              }));
        std::vector<planner::Sequence> batch = {
            planner::Sequence::Of(8, 1), planner::Sequence::Of(8, 2), planner::Sequence::Of(8, 3)};
        LOCKSTEP_ASSIGN_OR_RETURN(
            MicrobatchStream stream,
            trainer->ForwardMicroBatches(TrainerInputs::Of(batch, at::ones({24, 2}))));
        while (true) {
          LOCKSTEP_ASSIGN_OR_RETURN(std::optional<MicrobatchOutput> out, stream.Next());
          if (!out) break;
        }
        return absl::OkStatus();
      });
  EXPECT_FALSE(results[1].ok());
  EXPECT_TRUE(absl::IsUnavailable(results[0]) || absl::IsDeadlineExceeded(results[0]))
      << results[0];
  EXPECT_THAT(results[0].message(),
              HasSubstr("trainer rank 0: microbatch 1: gathering the outputs"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(40));
}

}  // namespace
}  // namespace trainer
}  // namespace lockstep
