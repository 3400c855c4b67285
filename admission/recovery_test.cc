// RecoveringRunner on one rank (no group) with injected out-of-memory failures: the accumulated
// gradient of the toy objective equals the run without failures, and the ledger proves every
// token counted once. Negative control: a staging that keeps a failed attempt's contribution is
// caught by the same comparison.

#include "admission/recovery.h"

#include <unistd.h>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "admission/gradient_staging.h"
#include "base/status_macros.h"
#include "base/status_testutil.h"
#include "c10/util/Exception.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "qualification/toy_objective.h"
#include "testing/fake_memory_probe.h"

namespace lockstep {
namespace admission {
namespace {

using qualification::MaxRelativeDifference;
using qualification::ToyObjective;
using ::testing::HasSubstr;

// Nine sequences of mixed lengths, budget 64: several microbatches of one or more sequences.
absl::StatusOr<planner::Plan> TestPlan(int cp_size = 1) {
  std::vector<planner::Sequence> batch;
  const int64_t lengths[] = {40, 12, 64, 7, 33, 50, 20, 9, 61};
  for (int i = 0; i < 9; ++i) batch.push_back(planner::Sequence::Of(lengths[i], 10 + i));
  planner::PlanOptions options;
  options.max_tokens_per_microbatch = 64;
  options.cp_size = cp_size;
  return planner::PlanMicrobatches(batch, options);
}

std::string LedgerPath(const std::string& name) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/recovery_", name, "_", getpid());
  RemoveLedgerFiles(path);
  return path;
}

// Decides whether an attempt runs out of memory (after its backward, so that a partial
// contribution really lands in .grad and must be discarded).
using OomRule = std::function<bool(const WaveWork&)>;

struct RunResult {
  at::Tensor gradient;
  StepReport report;
  int releases = 0;
};

absl::StatusOr<RunResult> RunToyStep(const planner::Plan& plan, const OomRule& oom,
                                     std::shared_ptr<Ledger> ledger,
                                     ContributionStaging* staging_override,
                                     int max_wave = 1 << 30) {
  LOCKSTEP_ASSIGN_OR_RETURN(ToyObjective objective, ToyObjective::Create(6, 3));
  LOCKSTEP_ASSIGN_OR_RETURN(MemoryModel model, MemoryModel::Of(1000, 10));
  GradientStaging staging(objective.parameters());
  FakeMemoryProbe probe(1 << 20);
  RecoveryOptions options;
  options.admission.max_microbatches_per_wave = max_wave;
  auto collaborators = RecoveringRunner::Collaborators::Of(
      &model, staging_override != nullptr ? staging_override : &staging);
  collaborators.probe = &probe;
  collaborators.ledger = ledger;
  LOCKSTEP_ASSIGN_OR_RETURN(
      auto runner, RecoveringRunner::Create(collaborators, /*cap_bytes=*/1 << 20, options));
  RunResult result;
  LOCKSTEP_ASSIGN_OR_RETURN(result.report,
                            runner->RunStep(7, plan, [&](const WaveWork& work) -> absl::Status {
                              probe.Touch(static_cast<int64_t>(work.predicted_bytes));
                              LOCKSTEP_RETURN_IF_ERROR(objective.RunWave(work, 0));
                              if (oom(work))
                                return absl::ResourceExhaustedError("injected: CUDA out of memory");
                              return absl::OkStatus();
                            }));
  LOCKSTEP_RETURN_IF_ERROR(runner->CommitStep(7));
  result.gradient = objective.weight().grad().clone();
  result.releases = probe.releases();
  return result;
}

// Fails the first attempt of every wave holding one of `ids`.
OomRule FirstAttemptOf(std::set<std::string> ids) {
  auto seen = std::make_shared<std::set<std::string>>();
  return [ids, seen](const WaveWork& work) {
    for (const std::string& id : work.ids) {
      if (ids.count(id) > 0 && seen->insert(id).second) return true;
    }
    return false;
  };
}

void ExpectLedgerCountsEveryTokenOnce(const std::string& path, const planner::Plan& plan) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LedgerReplay replay, Ledger::Replay(path));
  const StepReplay* step = replay.Find(7, 0);
  ASSERT_NE(step, nullptr);
  EXPECT_TRUE(step->committed);
  EXPECT_EQ(step->completed_tokens, plan.num_tokens());
  EXPECT_EQ(step->planned_tokens, plan.num_tokens());
  EXPECT_TRUE(step->missing.empty());
}

TEST(RecoveryTest, InjectedOutOfMemoryAtFirstMiddleAndLastMicrobatchKeepsTheGradient) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const planner::Plan plan, TestPlan());
  ASSERT_GE(plan.microbatches_size(), 4);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      RunResult reference,
      RunToyStep(
          plan, [](const WaveWork&) { return false; }, nullptr, nullptr, /*max_wave=*/1));
  EXPECT_EQ(reference.report.out_of_memory, 0);
  const int last = plan.microbatches_size() - 1;
  for (const std::string& victim : {std::string("0"), absl::StrCat(last / 2), absl::StrCat(last)}) {
    SCOPED_TRACE("out of memory at microbatch " + victim);
    const std::string path = LedgerPath("single_" + victim);
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Ledger> ledger,
                                  Ledger::OpenWriter(path, LedgerOptions::Of(0)));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(RunResult run,
                                  RunToyStep(plan, FirstAttemptOf({victim}), ledger, nullptr, 1));
    EXPECT_EQ(run.report.out_of_memory, 1);
    EXPECT_EQ(run.report.microbatch_splits, 1);
    EXPECT_EQ(run.releases, 1);
    EXPECT_EQ(run.report.final_plan.microbatches_size(), plan.microbatches_size() + 1);
    EXPECT_LE(MaxRelativeDifference(run.gradient, reference.gradient), 1e-6);
    ledger.reset();
    ExpectLedgerCountsEveryTokenOnce(path, plan);
  }
}

TEST(RecoveryTest, RepeatedOutOfMemoryForcesTwoSplitLevels) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const planner::Plan plan, TestPlan());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      RunResult reference, RunToyStep(
                               plan, [](const WaveWork&) { return false; }, nullptr, nullptr, 1));
  const std::string path = LedgerPath("two_levels");
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Ledger> ledger,
                                Ledger::OpenWriter(path, LedgerOptions::Of(0)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RunResult run,
                                RunToyStep(plan, FirstAttemptOf({"1", "1.0"}), ledger, nullptr, 1));
  EXPECT_EQ(run.report.out_of_memory, 2);
  EXPECT_EQ(run.report.microbatch_splits, 2);
  EXPECT_THAT(run.report.completed, ::testing::Contains("1.0.0"));
  EXPECT_THAT(run.report.completed, ::testing::Contains("1.0.1"));
  EXPECT_THAT(run.report.completed, ::testing::Contains("1.1"));
  EXPECT_LE(MaxRelativeDifference(run.gradient, reference.gradient), 1e-6);
  ledger.reset();
  ExpectLedgerCountsEveryTokenOnce(path, plan);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LedgerReplay replay, Ledger::Replay(path));
  const StepReplay* step = replay.Find(7, 0);
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->event_counts[static_cast<int>(LedgerEventKind::kFailed)], 2);
  EXPECT_EQ(step->event_counts[static_cast<int>(LedgerEventKind::kSplit)], 2);
  EXPECT_EQ(step->event_counts[static_cast<int>(LedgerEventKind::kRetried)], 4);
}

TEST(RecoveryTest, SplittingAWaveThatKeepsTheReductionOrderIsBitIdentical) {
  // The first wave holds several microbatches; its halves add the same gradients in the same
  // order (nothing accumulated before it), so the result is equal bit for bit.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const planner::Plan plan, TestPlan());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      RunResult reference,
      RunToyStep(
          plan, [](const WaveWork&) { return false; }, nullptr, nullptr, /*max_wave=*/2));
  ASSERT_GE(reference.report.waves_run, 2);
  auto first_wave = std::make_shared<bool>(true);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RunResult run, RunToyStep(
                                                   plan,
                                                   [first_wave](const WaveWork& work) {
                                                     const bool fail =
                                                         *first_wave && work.ids.size() == 2;
                                                     *first_wave = false;
                                                     return fail;
                                                   },
                                                   nullptr, nullptr, 2));
  EXPECT_EQ(run.report.wave_splits, 1);
  EXPECT_EQ(run.report.microbatch_splits, 0);
  EXPECT_TRUE(at::equal(run.gradient, reference.gradient));
}

// Negative control: a staging that does not drop a failed attempt's contribution.
class LeakyStaging : public ContributionStaging {
 public:
  absl::Status Begin() override { return absl::OkStatus(); }
  absl::Status Commit() override { return absl::OkStatus(); }
  void Discard() override {}
};

TEST(RecoveryTest, NegativeControlADoubleCountedRetryIsCaught) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const planner::Plan plan, TestPlan());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      RunResult reference, RunToyStep(
                               plan, [](const WaveWork&) { return false; }, nullptr, nullptr, 1));
  LeakyStaging leaky;
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RunResult run,
                                RunToyStep(plan, FirstAttemptOf({"2"}), nullptr, &leaky, 1));
  EXPECT_GT(MaxRelativeDifference(run.gradient, reference.gradient), 1e-3)
      << "the comparison must catch a retried microbatch counted twice";
}

// The toy objective, a model, a staging of its gradient and a runner over them.
class RecoveryRigTest : public ::testing::Test {
 protected:
  void SetUp() override { LOCKSTEP_ASSERT_OK_AND_ASSIGN(plan_, TestPlan()); }
  void Build(const RecoveryOptions& options) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ToyObjective objective, ToyObjective::Create(6, 3));
    objective_.emplace(std::move(objective));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(MemoryModel model, MemoryModel::Of(1000, 10));
    model_.emplace(std::move(model));
    staging_ = std::make_unique<GradientStaging>(objective_->parameters());
    auto runner = RecoveringRunner::Create(
        RecoveringRunner::Collaborators::Of(&*model_, staging_.get()), 1 << 20, options);
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = std::move(*runner);
  }
  planner::Plan plan_;
  std::optional<ToyObjective> objective_;
  std::optional<MemoryModel> model_;
  std::unique_ptr<GradientStaging> staging_;
  std::unique_ptr<RecoveringRunner> runner_;
};

TEST_F(RecoveryRigTest, ThrownOutOfMemoryIsRecoveredLikeAStatus) {
  ASSERT_NO_FATAL_FAILURE(Build(RecoveryOptions()));
  bool thrown = false;
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      StepReport report, runner_->RunStep(0, plan_, [&](const WaveWork& work) -> absl::Status {
        LOCKSTEP_RETURN_IF_ERROR(objective_->RunWave(work, 0));
        if (!thrown) {
          thrown = true;
          TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 2 GiB");
        }
        return absl::OkStatus();
      }));
  EXPECT_EQ(report.out_of_memory, 1);
  EXPECT_GT(model_->safety_factor(), 1.0);
}

TEST_F(RecoveryRigTest, OutOfMemoryBeyondTheSplitDepthFailsNamingTheMicrobatch) {
  RecoveryOptions options;
  options.max_split_depth = 2;
  options.admission.max_microbatches_per_wave = 1;
  ASSERT_NO_FATAL_FAILURE(Build(options));
  absl::StatusOr<StepReport> report =
      runner_->RunStep(0, plan_, [&](const WaveWork& work) -> absl::Status {
        if (work.ids[0].rfind("0", 0) == 0) return absl::ResourceExhaustedError("always");
        return objective_->RunWave(work, 0);
      });
  EXPECT_EQ(report.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(report.status().message(), HasSubstr("microbatch 0.0.0 ran out of memory after 2"));
}

TEST_F(RecoveryRigTest, OtherFailuresStopTheStepWithContextAndDropTheContribution) {
  ASSERT_NO_FATAL_FAILURE(Build(RecoveryOptions()));
  absl::StatusOr<StepReport> report =
      runner_->RunStep(3, plan_, [&](const WaveWork& work) -> absl::Status {
        LOCKSTEP_RETURN_IF_ERROR(objective_->RunWave(work, 0));
        return absl::InvalidArgumentError("bad input tensor");
      });
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(report.status().message(), HasSubstr("bad input tensor"));
  EXPECT_THAT(report.status().message(), HasSubstr("step 3, microbatch 0"));
  EXPECT_FALSE(objective_->weight().grad().defined()) << "a failed attempt's gradient must go";

  EXPECT_EQ(RecoveringRunner::Create(RecoveringRunner::Collaborators::Of(&*model_, nullptr), 1,
                                     RecoveryOptions())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RecoveringRunner::Create(RecoveringRunner::Collaborators::Of(&*model_, staging_.get()),
                                     0, RecoveryOptions())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace admission
}  // namespace lockstep
