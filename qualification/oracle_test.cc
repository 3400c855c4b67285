// The trainer's oracle (qualification/oracle.h) on multi-process Gloo worlds: DP1 x CP2,
// DP2 x CP2, TP2 x CP2 and DP2 x TP2 pass every check on every rank; each negative control makes
// the check that targets it fail. And a peer that dies mid-stream is an error, not a hang.

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "admission/memory_model.h"
#include "base/status_macros.h"
#include "base/stopwatch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "qualification/oracle.h"
#include "rng/model_stream.h"
#include "rng/rank_streams.h"
#include "rng/snapshot.h"
#include "testing/process_world.h"
#include "trainer/trainer_rank.h"

namespace lockstep {
namespace qualification {
namespace {

using ::testing::HasSubstr;

// Runs the oracle on a DP x TP x CP world; per rank, OK when every check passed, otherwise
// kFailedPrecondition listing the failed checks ("name: detail"), or the error.
std::vector<absl::Status> RunOracleWorld(int dp, int tp, int cp, NegativeControl control) {
  collectives::ProcessWorldOptions options;
  options.world_size = dp * tp * cp;
  return collectives::RunProcessWorld(options, [=](int, collectives::Communicator& world) {
    return RunTrainerOracleVerdict(world, dp, tp, cp, control, c10::Device(c10::kCPU), false);
  });
}

void ExpectAllPass(int dp, int tp, int cp) {
  const std::vector<absl::Status> results = RunOracleWorld(dp, tp, cp, NegativeControl::kNone);
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].ok()) << "DP" << dp << " x TP" << tp << " x CP" << cp << ", rank " << r
                                 << ": " << results[r];
  }
}

TEST(TrainerOracleTest, Dp1Cp2) { ExpectAllPass(1, 1, 2); }
TEST(TrainerOracleTest, Dp2Cp2) { ExpectAllPass(2, 1, 2); }
TEST(TrainerOracleTest, Tp2Cp2) { ExpectAllPass(1, 2, 2); }
TEST(TrainerOracleTest, Dp2Tp2) { ExpectAllPass(2, 2, 1); }
TEST(TrainerOracleTest, Dp1Cp4) { ExpectAllPass(1, 1, 4); }

// The control must make `check` fail on at least one rank of DP`dp` x TP`tp` x CP`cp`, and no
// rank may error out.
void ExpectDetected(NegativeControl control, const std::string& check, int dp = 1, int tp = 2,
                    int cp = 2) {
  const std::vector<absl::Status> results = RunOracleWorld(dp, tp, cp, control);
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

// A gather that reads another CP rank's shard: caught at TP 1 too, where every row has one owner
// (comparing the members' full outputs could not see it there, had every member read alike).
TEST(TrainerOracleTest, NegativeControlMisroutedGather) {
  ExpectDetected(NegativeControl::kMisroutedGather, "replica_outputs");
  ExpectDetected(NegativeControl::kMisroutedGather, "replica_outputs", 1, 1, 2);
}

TEST(TrainerOracleTest, NegativeControlResumeWithoutTheCallerStreamModelStreamOrOptimizer) {
  ExpectDetected(NegativeControl::kResumeWithoutCallerStream, "resume", 1, 1, 2);
  ExpectDetected(NegativeControl::kResumeWithoutModelStream, "resume", 1, 1, 2);
  ExpectDetected(NegativeControl::kResumeWithoutOptimizer, "resume", 1, 1, 2);
}

// Wrong split arithmetic, planted in the reference run too (a no-op there): reference_match
// catches each, and neither changes anything without the split it breaks.
TEST(TrainerOracleTest, NegativeControlEmptyShardSkipsTheGather) {
  ExpectDetected(NegativeControl::kEmptyShardSkipsGather, "empty_cp_shard", 1, 1, 2);
}

TEST(TrainerOracleTest, NegativeControlsOfTheSplitArithmetic) {
  ExpectDetected(NegativeControl::kCpLocalAttention, "reference_match", 1, 1, 2);
  ExpectDetected(NegativeControl::kTpUnreducedGradient, "reference_match", 1, 2, 1);
  for (NegativeControl control :
       {NegativeControl::kCpLocalAttention, NegativeControl::kTpUnreducedGradient}) {
    for (const absl::Status& s : RunOracleWorld(2, 1, 1, control)) EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(TrainerOracleTest, NegativeControlSynchronizationDisabled) {
  ExpectDetected(NegativeControl::kNoSync, "caller_draws");
}

TEST(TrainerOracleTest, NegativeControlNoSynchronizationAfterTheStreamsHandBacks) {
  ExpectDetected(NegativeControl::kNoSyncAfterMicrobatch, "caller_draws");
}

TEST(TrainerOracleTest, NegativeControlNoSynchronizationAfterForwardAllMicrobatches) {
  ExpectDetected(NegativeControl::kNoSyncAfterDpForward, "caller_draws");
}

TEST(TrainerOracleTest, NegativeControlResumeWithoutNamedStreams) {
  ExpectDetected(NegativeControl::kResumeWithoutNamedStreams, "resume");
}

TEST(TrainerOracleTest, NegativeControlModelWorkOnTheCallersStream) {
  ExpectDetected(NegativeControl::kUnscopedModelWork, "stream_progression");
}

TEST(TrainerOracleTest, NegativeControlInputMaterialisedInsideTheScope) {
  ExpectDetected(NegativeControl::kInputInsideScope, "reference_match");
}

TEST(TrainerOracleTest, APeerThatDiesMidStreamIsAnErrorWithinTheTimeout) {
  collectives::ProcessWorldOptions options;
  options.world_size = 2;
  options.collective_timeout = absl::Seconds(4);
  const Stopwatch start;
  std::vector<absl::Status> results = collectives::RunProcessWorld(
      options, [](int rank, collectives::Communicator& world) -> absl::Status {
        LOCKSTEP_ASSIGN_OR_RETURN(collectives::Topology topology,
                                  collectives::Topology::CreateExact(2, 1, 1, 2));
        LOCKSTEP_ASSIGN_OR_RETURN(auto group, world.NewGroup(topology.TpCpGroup(rank)));
        LOCKSTEP_ASSIGN_OR_RETURN(auto streams,
                                  rng::RankStreams::Create(rng::DefaultGenerators::CpuOnly()));
        int calls = 0;
        LOCKSTEP_ASSIGN_OR_RETURN(
            auto trainer,
            trainer::TrainerRank::Create(
                trainer::TrainerConfig::Of(8),
                trainer::TrainerRank::Collaborators::Of(topology, rank, std::move(group), streams),
                [&](const trainer::ShardWork& work) -> absl::StatusOr<at::Tensor> {
                  if (rank == 1 && ++calls == 2) _exit(3);
                  return work.inputs * 2;
                }));
        std::vector<planner::Sequence> batch = {
            planner::Sequence::Of(8, 1), planner::Sequence::Of(8, 2), planner::Sequence::Of(8, 3)};
        LOCKSTEP_ASSIGN_OR_RETURN(
            trainer::MicrobatchStream stream,
            trainer->ForwardMicrobatches(trainer::TrainerInputs::Of(batch, at::ones({24, 2}))));
        while (true) {
          LOCKSTEP_ASSIGN_OR_RETURN(std::optional<trainer::MicrobatchOutput> out, stream.Next());
          if (!out) break;
        }
        return absl::OkStatus();
      });
  EXPECT_FALSE(results[1].ok());
  EXPECT_TRUE(absl::IsUnavailable(results[0]) || absl::IsDeadlineExceeded(results[0]))
      << results[0];
  // The survivor waits in the outcome agreement after microbatch 1's forward, where its peer died.
  EXPECT_THAT(
      std::string(results[0].message()),
      ::testing::AllOf(HasSubstr("microbatch 1, attempt 1: agreeing on the attempt's outcome"),
                       HasSubstr("trainer rank 0")));
  EXPECT_LT(start.Elapsed(), absl::Seconds(40));
}

// An out-of-memory failure in the forward of one replica (before its model-stream draw, while the
// other replica drew): every replica discards the attempt, rewinds the model stream, splits the
// microbatch and retries; the stream yields one more microbatch, the gradient equals the run
// without the failure, and the model streams still agree.
// Where rank `rank` of the parent process's run reports; `parent` is the test process's pid.
std::string ReportPath(pid_t parent, int rank, bool inject, bool use_stream) {
  return absl::StrCat(::testing::TempDir(), "/oom_report_", parent, "_", rank,
                      inject ? "_injected" : "_clean", use_stream ? "_stream" : "_dp");
}

std::vector<std::string> ReadReport(int rank, bool inject, bool use_stream) {
  std::ifstream in(ReportPath(getpid(), rank, inject, use_stream));
  std::string line;
  std::getline(in, line);
  return absl::StrSplit(line, ' ');
}

absl::Status OomRecoveryBody(int rank, collectives::Communicator& world, bool inject,
                             bool use_stream) {
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::Topology topology,
                            collectives::Topology::CreateExact(2, 1, 1, 2));
  LOCKSTEP_ASSIGN_OR_RETURN(std::shared_ptr<collectives::Communicator> group,
                            world.NewGroup(topology.TpCpGroup(rank)));
  LOCKSTEP_ASSIGN_OR_RETURN(auto streams,
                            rng::RankStreams::Create(rng::DefaultGenerators::CpuOnly()));
  LOCKSTEP_ASSIGN_OR_RETURN(admission::MemoryModel memory, admission::MemoryModel::Of(0, 1));
  trainer::TrainerConfig config = trainer::TrainerConfig::Of(16);
  config.plan.packing = planner::PACKING_IN_ORDER;
  config.memory_model = memory;
  config.memory_cap_bytes = 1 << 20;
  at::Tensor w = at::linspace(0.5, 1.5, 3).set_requires_grad(true);
  int calls = 0;
  LOCKSTEP_ASSIGN_OR_RETURN(
      auto trainer,
      trainer::TrainerRank::Create(
          config, trainer::TrainerRank::Collaborators::Of(topology, rank, group, streams),
          [&](const trainer::ShardWork& work) -> absl::StatusOr<at::Tensor> {
            if (inject && rank == 1 && ++calls == 2) {
              return absl::ResourceExhaustedError("injected: out of memory");
            }
            (void)at::rand({1});  // a model-stream draw
            return work.inputs * w;
          }));
  std::vector<planner::Sequence> batch = {planner::Sequence::Of(10, 1), planner::Sequence::Of(6, 2),
                                          planner::Sequence::Of(12, 3),
                                          planner::Sequence::Of(4, 4)};
  at::Tensor rows = at::cos(at::arange(32 * 3, at::kFloat).reshape({32, 3}));
  std::vector<trainer::MicrobatchOutput> outputs;
  if (use_stream) {
    LOCKSTEP_ASSIGN_OR_RETURN(
        trainer::MicrobatchStream stream,
        trainer->ForwardMicrobatches(trainer::TrainerInputs::Of(batch, rows)));
    while (true) {
      LOCKSTEP_ASSIGN_OR_RETURN(std::optional<trainer::MicrobatchOutput> out, stream.Next());
      if (!out) break;
      outputs.push_back(*out);
    }
  } else {
    LOCKSTEP_ASSIGN_OR_RETURN(
        outputs, trainer->ForwardAllMicrobatches(trainer::TrainerInputs::Of(batch, rows)));
  }
  for (const trainer::MicrobatchOutput& out : outputs) {
    (out.loss_weights.to(at::kFloat).unsqueeze(1) * out.outputs.pow(2)).sum().backward();
  }
  at::Tensor grad = w.grad().clone();
  LOCKSTEP_RETURN_IF_ERROR(group->AllReduceSum(grad));
  // The model streams agree across the replicas.
  LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot live,
                            rng::RngSnapshot::Capture(streams->generators()));
  at::Tensor model_state;
  {
    LOCKSTEP_ASSIGN_OR_RETURN(rng::ModelStreamScope scope, rng::ModelStreamScope::Enter(*streams));
    model_state = at::rand({4});  // the next model-stream draws
    LOCKSTEP_RETURN_IF_ERROR(scope.Exit());
  }
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> states, group->AllGather(model_state));
  if (!at::equal(states[0], states[1])) {
    return absl::InternalError("the replicas' model streams differ after the recovery");
  }
  // Report "<microbatches> <recoveries> <gradient x3>" to the parent through a file.
  std::ofstream(ReportPath(getppid(), rank, inject, use_stream))
      << outputs.size() << " " << trainer->out_of_memory_recovered() << " "
      << absl::StrFormat("%.9g %.9g %.9g", grad[0].item<double>(), grad[1].item<double>(),
                         grad[2].item<double>());
  return absl::OkStatus();
}

TEST(TrainerOracleTest, OutOfMemoryInOneReplicasForwardIsRecoveredOnEveryReplica) {
  for (bool use_stream : {true, false}) {
    SCOPED_TRACE(use_stream ? "microbatch stream" : "DpRankForward");
    std::vector<absl::Status> clean = collectives::RunProcessWorld(
        collectives::ProcessWorldOptions::Of(2), [&](int rank, collectives::Communicator& world) {
          return OomRecoveryBody(rank, world, false, use_stream);
        });
    std::vector<absl::Status> recovered = collectives::RunProcessWorld(
        collectives::ProcessWorldOptions::Of(2), [&](int rank, collectives::Communicator& world) {
          return OomRecoveryBody(rank, world, true, use_stream);
        });
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(clean[r].ok()) << clean[r];
      ASSERT_TRUE(recovered[r].ok()) << recovered[r];
      const std::vector<std::string> a = ReadReport(r, false, use_stream);
      const std::vector<std::string> b = ReadReport(r, true, use_stream);
      ASSERT_EQ(a.size(), 5u);
      ASSERT_EQ(b.size(), 5u);
      EXPECT_EQ(std::stoi(b[0]), std::stoi(a[0]) + 1) << "the split yields one more microbatch";
      EXPECT_EQ(a[1], "0");
      EXPECT_EQ(b[1], "1");
      for (int i = 2; i < 5; ++i) {
        EXPECT_NEAR(std::stod(b[i]), std::stod(a[i]), 1e-6 * std::abs(std::stod(a[i])))
            << "gradient element " << i - 2;
      }
    }
  }
}

}  // namespace
}  // namespace qualification
}  // namespace lockstep
