// RecoveringRunner across a TP x CP group of real processes over Gloo: out of memory on only one
// replica makes every replica split the same way, the group's gradient equals the run without
// failures, and each rank's ledger counts every token once. A replica failing otherwise, or
// dying, stops every replica with an error within the timeout — never a hang.

#include <unistd.h>

#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "admission/gradient_staging.h"
#include "admission/ledger.h"
#include "admission/recovery.h"
#include "base/status_macros.h"
#include "base/stopwatch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "qualification/toy_objective.h"
#include "testing/process_world.h"

namespace lockstep {
namespace admission {
namespace {

using qualification::MaxRelativeDifference;
using qualification::ToyObjective;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kCp = 2;

absl::StatusOr<planner::Plan> TestPlan() {
  std::vector<planner::Sequence> batch;
  const int64_t lengths[] = {40, 12, 64, 7, 33, 50, 20, 9, 61, 3};
  for (int i = 0; i < 10; ++i) batch.push_back(planner::Sequence::Of(lengths[i], 10 + i));
  planner::PlanOptions options;
  options.max_tokens_per_microbatch = 64;
  options.cp_size = kCp;
  return planner::PlanMicrobatches(batch, options);
}

std::string LedgerPath(const std::string& name, int rank) {
  return absl::StrCat(::testing::TempDir(), "/recovery_process_", name, "_", getppid(), "_", rank);
}

struct GroupRun {
  at::Tensor gradient;  // summed over the group
  StepReport report;
};

// One step of the toy objective on this rank's CP shard; `fail` decides the callback's outcome
// after its backward.
absl::StatusOr<GroupRun> RunGroupStep(collectives::Communicator& group, int cp_rank,
                                      std::shared_ptr<Ledger> ledger,
                                      const std::function<absl::Status(const WaveWork&)>& fail) {
  LOCKSTEP_ASSIGN_OR_RETURN(const planner::Plan plan, TestPlan());
  LOCKSTEP_ASSIGN_OR_RETURN(ToyObjective objective, ToyObjective::Create(5, 1));
  LOCKSTEP_ASSIGN_OR_RETURN(MemoryModel model, MemoryModel::Of(1000, 10));
  GradientStaging staging(objective.parameters());
  RecoveryOptions options;
  options.admission.max_microbatches_per_wave = 1;
  auto collaborators = RecoveringRunner::Collaborators::Of(&model, &staging);
  collaborators.group = &group;
  collaborators.ledger = ledger;
  LOCKSTEP_ASSIGN_OR_RETURN(auto runner, RecoveringRunner::Create(collaborators, 1 << 20, options));
  GroupRun run;
  LOCKSTEP_ASSIGN_OR_RETURN(run.report,
                            runner->RunStep(1, plan, [&](const WaveWork& work) -> absl::Status {
                              LOCKSTEP_RETURN_IF_ERROR(objective.RunWave(work, cp_rank));
                              return fail(work);
                            }));
  LOCKSTEP_RETURN_IF_ERROR(runner->CommitStep(1));
  run.gradient = objective.weight().grad().clone();
  LOCKSTEP_RETURN_IF_ERROR(group.AllReduceSum(run.gradient));
  return run;
}

absl::Status OomOnOneReplicaBody(int rank, collectives::Communicator& world) {
  const int cp_rank = rank % kCp;
  LOCKSTEP_ASSIGN_OR_RETURN(
      GroupRun reference,
      RunGroupStep(world, cp_rank, nullptr, [](const WaveWork&) { return absl::OkStatus(); }));
  const std::string path = LedgerPath(absl::StrCat("oom", world.size()), rank);
  RemoveLedgerFiles(path);
  LOCKSTEP_ASSIGN_OR_RETURN(std::shared_ptr<Ledger> ledger,
                            Ledger::OpenWriter(path, LedgerOptions::Of(0)));
  // Only the last rank runs out of memory, at the first attempt of microbatch 1 and of its first
  // half: two split levels, decided by one replica.
  const bool victim = rank == world.size() - 1;
  LOCKSTEP_ASSIGN_OR_RETURN(
      GroupRun run, RunGroupStep(world, cp_rank, ledger, [&](const WaveWork& work) {
        if (victim && work.attempt == 1 && (work.ids[0] == "1" || work.ids[0] == "1.0") &&
            work.ids.size() == 1) {
          static std::vector<std::string> failed;
          if (std::find(failed.begin(), failed.end(), work.ids[0]) == failed.end()) {
            failed.push_back(work.ids[0]);
            return absl::ResourceExhaustedError("injected out of memory on one replica");
          }
        }
        return absl::OkStatus();
      }));
  ledger.reset();
  if (run.report.out_of_memory != 2 || run.report.microbatch_splits != 2) {
    return absl::InternalError(
        absl::StrCat("rank ", rank, ": ", run.report.out_of_memory, " out-of-memory outcomes and ",
                     run.report.microbatch_splits, " splits; every replica should see 2 and 2"));
  }
  const double difference = MaxRelativeDifference(run.gradient, reference.gradient);
  if (!(difference <= 1e-6)) {
    return absl::InternalError(absl::StrCat("rank ", rank,
                                            ": the group's gradient differs from "
                                            "the run without failures by ",
                                            difference, " (relative)"));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(const planner::Plan plan, TestPlan());
  LOCKSTEP_ASSIGN_OR_RETURN(LedgerReplay replay, Ledger::Replay(path));
  const StepReplay* step = replay.Find(1, 0);
  if (step == nullptr || !step->committed || step->completed_tokens != plan.num_tokens() ||
      !step->missing.empty()) {
    return absl::InternalError(absl::StrCat("rank ", rank,
                                            ": the ledger does not show every "
                                            "token counted once:\n",
                                            replay.Summary()));
  }
  return absl::OkStatus();
}

TEST(RecoveryProcessTest, OutOfMemoryOnOneReplicaOfCp2SplitsEveryReplicaTheSameWay) {
  std::vector<absl::Status> results =
      collectives::RunProcessWorld(collectives::ProcessWorldOptions::Of(2), OomOnOneReplicaBody);
  for (size_t r = 0; r < results.size(); ++r) EXPECT_TRUE(results[r].ok()) << r << results[r];
}

TEST(RecoveryProcessTest, OutOfMemoryOnOneReplicaOfTp2Cp2SplitsEveryReplicaTheSameWay) {
  std::vector<absl::Status> results =
      collectives::RunProcessWorld(collectives::ProcessWorldOptions::Of(4), OomOnOneReplicaBody);
  for (size_t r = 0; r < results.size(); ++r) EXPECT_TRUE(results[r].ok()) << r << results[r];
}

TEST(RecoveryProcessTest, AReplicaFailingOtherwiseStopsEveryReplica) {
  std::vector<absl::Status> results = collectives::RunProcessWorld(
      collectives::ProcessWorldOptions::Of(2),
      [](int rank, collectives::Communicator& world) -> absl::Status {
        return RunGroupStep(world, rank, nullptr,
                            [rank](const WaveWork& work) {
                              if (rank == 1 && work.ids[0] == "2")
                                return absl::InternalError("broken kernel");
                              return absl::OkStatus();
                            })
            .status();
      });
  EXPECT_EQ(results[1].code(), absl::StatusCode::kInternal);
  EXPECT_THAT(results[1].message(), HasSubstr("broken kernel"));
  EXPECT_EQ(results[0].code(), absl::StatusCode::kAborted);
  // The peer learns which rank failed and why.
  EXPECT_THAT(std::string(results[0].message()),
              AllOf(HasSubstr("step 1, microbatch 2, attempt 1: global rank 1 of the group failed"),
                    HasSubstr("INTERNAL: broken kernel")));
}

TEST(RecoveryProcessTest, AReplicaThatDiesIsAnErrorWithinTheTimeoutNotAHang) {
  const Stopwatch start;
  collectives::ProcessWorldOptions options;
  options.world_size = 2;
  options.collective_timeout = absl::Seconds(4);
  options.deadline = absl::Seconds(60);
  std::vector<absl::Status> results = collectives::RunProcessWorld(
      options, [](int rank, collectives::Communicator& world) -> absl::Status {
        return RunGroupStep(world, rank, nullptr,
                            [rank](const WaveWork& work) {
                              if (rank == 1 && work.ids[0] == "2") _exit(9);
                              return absl::OkStatus();
                            })
            .status();
      });
  EXPECT_FALSE(results[1].ok());
  EXPECT_TRUE(absl::IsUnavailable(results[0]) || absl::IsDeadlineExceeded(results[0]))
      << results[0];
  EXPECT_THAT(results[0].message(), HasSubstr("step 1, microbatch 2"));
  EXPECT_LT(start.Elapsed(), absl::Seconds(40));
}

}  // namespace
}  // namespace admission
}  // namespace lockstep
