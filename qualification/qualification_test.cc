// qualification: each of qualify's checks passes on a real DP2 x CP2 world over Gloo and
// fails under its negative control; the negative controls themselves; option validation.

#include "qualification/qualification.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_testutil.h"
#include "base/stopwatch.h"
#include "checkpoint/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "qualification/aliasing_testutil.h"
#include "rng/rank_streams.h"
#include "rng/snapshot.h"
#include "testing/process_world.h"

namespace lockstep {
namespace qualification {
namespace {

using ::testing::HasSubstr;

using Check = absl::StatusOr<CheckResult> (*)(RankSetup&);

// Runs `check` on every rank of a DP2 x TP1 x CP2 world under `control` (after `adjust` changes
// each rank's setup); returns, per rank, OK when the check passed, kFailedPrecondition carrying
// its detail when it failed, or the error that stopped it.
std::vector<absl::Status> RunCheck(NegativeControl control, Check check,
                                   std::function<void(RankSetup&)> adjust = nullptr) {
  collectives::ProcessWorldOptions options;
  options.world_size = 4;
  return collectives::RunProcessWorld(
      options, [control, check, adjust](int, collectives::Communicator& world) -> absl::Status {
        absl::StatusOr<collectives::Topology> topology = collectives::Topology::Create(4, 1, 2);
        if (!topology.ok()) return topology.status();
        absl::StatusOr<RankSetup> setup = SetUpRank(world, *topology, control);
        if (!setup.ok()) return setup.status();
        if (adjust) adjust(*setup);
        absl::StatusOr<CheckResult> result = check(*setup);
        if (!result.ok()) return result.status();
        if (!result->passed) return absl::FailedPreconditionError(result->detail);
        return absl::OkStatus();
      });
}

void ExpectPassesEverywhere(const std::vector<absl::Status>& results) {
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_TRUE(results[r].ok()) << r << ": " << results[r];
}

// The check must fail (not error) on at least one rank, with `detail` in its message.
void ExpectDetected(const std::vector<absl::Status>& results, const std::string& detail) {
  int failed = 0;
  for (size_t r = 0; r < results.size(); ++r) {
    if (results[r].ok()) continue;
    EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << r << ": " << results[r];
    EXPECT_THAT(results[r].message(), HasSubstr(detail)) << r;
    ++failed;
  }
  EXPECT_GT(failed, 0) << "the negative control went undetected";
}

TEST(QualificationTest, ReplicaAgreementAndItsNegativeControl) {
  ExpectPassesEverywhere(RunCheck(NegativeControl::kNone, &CheckReplicaAgreement));
  ExpectDetected(RunCheck(NegativeControl::kNoSync, &CheckReplicaAgreement),
                 "differ from their leader");
}

TEST(QualificationTest, DpWorkersIndependentAndItsNegativeControl) {
  ExpectPassesEverywhere(RunCheck(NegativeControl::kNone, &CheckDpWorkersIndependent));
  ExpectDetected(RunCheck(NegativeControl::kWorldSync, &CheckDpWorkersIndependent),
                 "draw what DP worker 0 draws");
}

TEST(QualificationTest, ModelStreamAndItsNegativeControls) {
  ExpectPassesEverywhere(RunCheck(NegativeControl::kNone, &CheckModelStream));
  ExpectDetected(RunCheck(NegativeControl::kUnscopedModelWork, &CheckModelStream),
                 "caller DISTURBED");
  ExpectDetected(RunCheck(NegativeControl::kNoSync, &CheckModelStream), "replica(s) differ");
}

TEST(QualificationTest, ExceptionRestorationAndItsNegativeControl) {
  ExpectPassesEverywhere(RunCheck(NegativeControl::kNone, &CheckExceptionRestoration));
  ExpectDetected(RunCheck(NegativeControl::kUnscopedModelWork, &CheckExceptionRestoration),
                 "left the caller's CPU generator changed");
  // A scope that restores only when exited normally: both unwinding paths are caught.
  ExpectDetected(RunCheck(NegativeControl::kNoRestoreOnUnwind, &CheckExceptionRestoration),
                 "an exception thrown through the scope and an error returned from inside the "
                 "scope left the caller's CPU generator changed");
}

TEST(QualificationTest, PartitionInvarianceAndItsNegativeControl) {
  ExpectPassesEverywhere(RunCheck(NegativeControl::kNone, &CheckPartitionInvariance));
  ExpectDetected(RunCheck(NegativeControl::kShardLocalPhilox, &CheckPartitionInvariance),
                 "DO NOT reassemble");
}

TEST(QualificationTest, RecomputeAndItsNegativeControl) {
  ExpectPassesEverywhere(RunCheck(NegativeControl::kNone, &CheckRecompute));
  ExpectDetected(RunCheck(NegativeControl::kAliasingSnapshot, &CheckRecompute),
                 "recompute mask != forward mask");
}

// With no failure injected there is nothing recovered, and the check must not pass on that.
TEST(QualificationTest, OomRecoveryWithNothingInjectedFails) {
  ExpectDetected(RunCheck(NegativeControl::kNone, &CheckOomRecovery,
                          [](RankSetup& setup) { setup.inject_oom = 0; }),
                 "no out-of-memory failure was injected: nothing was recovered");
}

TEST(QualificationTest, OomRecoveryAndItsNegativeControl) {
  ExpectPassesEverywhere(RunCheck(NegativeControl::kNone, &CheckOomRecovery));
  ExpectDetected(RunCheck(NegativeControl::kDoubleCountedRetry, &CheckOomRecovery),
                 "differs from the plain accumulation");
  // A commit that replaces the accumulated gradient: the reference, which goes through no
  // staging, catches it.
  ExpectDetected(RunCheck(NegativeControl::kStagingReplaces, &CheckOomRecovery),
                 "differs from the plain accumulation");
}

// CheckTrainer returns the oracle's rows; a run passes when every row does. A failing row names
// its check in the status, so ExpectDetected can see which one caught the control.
absl::StatusOr<CheckResult> TrainerRows(RankSetup& setup) {
  absl::StatusOr<std::vector<CheckResult>> rows = CheckTrainer(setup);
  if (!rows.ok()) return rows.status();
  if (rows->empty()) return absl::InternalError("the trainer check returned no rows");
  CheckResult folded = (*rows)[0];
  folded.passed = true;
  folded.detail.clear();
  for (const CheckResult& row : *rows) {
    if (row.passed) continue;
    folded.passed = false;
    folded.detail += row.name + ": " + row.detail + "; ";
  }
  return folded;
}

TEST(QualificationTest, TrainerAndItsNegativeControls) {
  ExpectPassesEverywhere(RunCheck(NegativeControl::kNone, &TrainerRows));
  ExpectDetected(RunCheck(NegativeControl::kNoSync, &TrainerRows), "caller_draws");
  ExpectDetected(RunCheck(NegativeControl::kUnscopedModelWork, &TrainerRows), "stream_progression");
  ExpectDetected(RunCheck(NegativeControl::kInputInsideScope, &TrainerRows), "reference_match");
  // The synchronization after one forward path only: the leader's extra draws between hand-backs
  // make the replicas' caller states differ there.
  ExpectDetected(RunCheck(NegativeControl::kNoSyncAfterMicrobatch, &TrainerRows), "caller_draws");
  ExpectDetected(RunCheck(NegativeControl::kNoSyncAfterDpForward, &TrainerRows), "caller_draws");
  ExpectDetected(RunCheck(NegativeControl::kResumeWithoutNamedStreams, &TrainerRows), "resume");
  ExpectDetected(RunCheck(NegativeControl::kMisroutedGather, &TrainerRows), "replica_outputs");
}

// The aliasing saver itself (moved here from checkpoint_test with the saver): forward is
// unaffected, but the recompute draws another mask, so the gradients differ from the plain
// block's; the value saver reproduces them.
TEST(AliasingRngSaverTest, ChangesTheRecomputedMask) {
  const rng::DefaultGenerators cpu = rng::DefaultGenerators::CpuOnly();
  const at::TensorOptions options = at::TensorOptions().dtype(at::kFloat);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(DropoutBlockRun plain, RunDropoutBlock(options, nullptr));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(DropoutBlockRun broken,
                                RunDropoutBlock(options, std::make_shared<AliasingRngSaver>(cpu)));
  EXPECT_TRUE(at::equal(plain.output, broken.output)) << "forward is unaffected";
  EXPECT_FALSE(at::equal(plain.weight_grad, broken.weight_grad))
      << "the aliasing snapshot went unnoticed: recompute reused the forward mask";
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<rng::RankStreams> streams,
                                rng::RankStreams::Create(cpu));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(DropoutBlockRun sound,
                                RunDropoutBlock(options, checkpoint::StreamSnapshots::Of(streams)));
  EXPECT_TRUE(at::equal(plain.weight_grad, sound.weight_grad));
}

TEST(NegativeControlTest, NamesParseBothWays) {
  for (const std::string& name : NegativeControlNames()) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(NegativeControl control, ParseNegativeControl(name));
    EXPECT_EQ(NegativeControlName(control), name);
  }
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const NegativeControl none, ParseNegativeControl(""));
  EXPECT_EQ(none, NegativeControl::kNone);
  const absl::Status unknown = ParseNegativeControl("no_sync").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(), HasSubstr("unknown negative control 'no_sync'; known: no-sync"));
}

TEST(QualifyOptionsTest, LimitsAreNamed) {
  EXPECT_TRUE(ValidateQualifyOptions(QualifyOptions::Topology(2, 1, 2)).ok());
  EXPECT_THAT(ValidateQualifyOptions(QualifyOptions::Topology(0, 1, 1)).message(),
              HasSubstr("--dp 0 is not a positive integer"));
  EXPECT_THAT(ValidateQualifyOptions(QualifyOptions::Topology(2147483647, 1, 1)).message(),
              HasSubstr("--dp 2147483647 exceeds qualify's world limit of 64"));
  EXPECT_THAT(ValidateQualifyOptions(QualifyOptions::Topology(16, 8, 1)).message(),
              HasSubstr("--dp 16 x --tp 8 x --cp 1 = 128 processes exceeds qualify's limit of 64"));
  QualifyOptions no_failure = QualifyOptions::Topology(1, 1, 1);
  no_failure.inject_oom = 0;
  EXPECT_THAT(ValidateQualifyOptions(no_failure).message(),
              HasSubstr("--inject_oom 0 is outside [1, 8]: oom_recovery needs at least one"));
  QualifyOptions no_time = QualifyOptions::Topology(1, 1, 1);
  no_time.timeout = absl::ZeroDuration();
  EXPECT_THAT(ValidateQualifyOptions(no_time).message(), HasSubstr("--timeout_seconds"));
}

TEST(QualifyOptionsTest, TheMachineLimitsAreNamed) {
  const QualifyOptions four = QualifyOptions::Topology(2, 1, 2);
  EXPECT_TRUE(ValidateQualifyMachine(four, 2, int64_t{8} << 30).ok());
  // Unknown memory (-1) is not held against the job.
  EXPECT_TRUE(ValidateQualifyMachine(four, 2, -1).ok());
  const absl::Status cores = ValidateQualifyMachine(QualifyOptions::Topology(8, 1, 4), 1, -1);
  EXPECT_EQ(cores.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(cores.message(), HasSubstr("--dp 8 x --tp 1 x --cp 4 = 32 worker processes exceed "
                                         "16 per core on this machine's 1 core(s)"));
  const absl::Status memory = ValidateQualifyMachine(four, 2, int64_t{512} << 20);
  EXPECT_EQ(memory.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(memory.message(),
              HasSubstr("need 1024 MiB (256 MiB each); this machine has 512 MiB available"));
  QualifyOptions no_deadline = four;
  no_deadline.deadline = absl::Seconds(-1);
  EXPECT_THAT(ValidateQualifyOptions(no_deadline).message(),
              HasSubstr("--deadline_seconds -1s must be positive"));
  EXPECT_EQ(DefaultDeadline(absl::Seconds(120)), absl::Seconds(420));
}

// A stand-in worker: writes a passing report for its rank naming every check `options` expects
// but those in `omit` (the second actor's round, --actor_round, writes the actors check), then
// (when `stall`) stops itself with SIGSTOP after reporting, as a rank wedged after its last
// collective would.
std::string WriteStubWorker(const QualifyOptions& options, bool stall,
                            const std::vector<std::string>& omit = {}) {
  std::string checks, sep;
  for (const std::string& name : ExpectedChecks(options)) {
    if (name == "actors" || std::find(omit.begin(), omit.end(), name) != omit.end()) continue;
    absl::StrAppend(&checks, sep, "{\"name\": \"", name, "\", \"passed\": true, \"detail\": \"\"}");
    sep = ", ";
  }
  static int scripts = 0;
  const std::string path = absl::StrCat(testing::TempDir(), "/stub_worker_", ++scripts, ".sh");
  std::ofstream script(path, std::ios::trunc);
  script << "#!/bin/sh\n"
            "round=rank\n"
            "for a; do case $a in --results_dir=*) dir=${a#--results_dir=};;"
            " --actor_round) round=actors.rank;; esac; done\n"
            "if [ $round = rank ]; then\n"
            "  echo '{\"checks\": ["
         << checks
         << "]}' > \"$dir/rank$RANK.json\"\n"
            "else\n"
            "  echo '{\"checks\": [{\"name\": \"actors\", \"passed\": true, \"detail\": \"\"}]}'"
            " > \"$dir/actors.rank$RANK.json\"\n"
            "fi\n"
         << (stall ? "[ $round = rank ] && [ \"$RANK\" = 1 ] && kill -STOP $$\n" : "")
         << "exit 0\n";
  script.close();
  chmod(path.c_str(), 0755);
  return path;
}

TEST(RunQualifyTest, ACheckNoRankReportedFailsTheVerdict) {
  QualifyOptions options = QualifyOptions::Topology(2, 1, 2);
  options.timeout = absl::Seconds(5);
  options.executable = WriteStubWorker(options, /*stall=*/false);
  std::ostringstream all;
  absl::StatusOr<bool> passed = RunQualify(options, all);
  ASSERT_TRUE(passed.ok()) << passed.status();
  // The control: every expected check reported by every rank passes.
  EXPECT_TRUE(*passed) << all.str();
  // The trainer's family stops reporting on every rank.
  options.executable = WriteStubWorker(options, /*stall=*/false,
                                       {"replica_outputs", "caller_draws", "stream_progression",
                                        "reference_match", "resume", "empty_cp_shard"});
  std::ostringstream out;
  passed = RunQualify(options, out);
  ASSERT_TRUE(passed.ok()) << passed.status();
  EXPECT_FALSE(*passed) << out.str();
  EXPECT_THAT(out.str(),
              ::testing::ContainsRegex("replica_outputs +FAIL +0/4 +no rank reported it"));
  EXPECT_THAT(out.str(),
              ::testing::ContainsRegex("empty_cp_shard +FAIL +0/4 +no rank reported it"));
  EXPECT_THAT(out.str(), HasSubstr("FAIL: DP2 x TP1 x CP2"));
}

TEST(RunQualifyTest, TheExpectedChecksAreSixteenAndFifteenAtCpOne) {
  const std::vector<std::string> four = ExpectedChecks(QualifyOptions::Topology(2, 1, 2));
  EXPECT_EQ(four.size(), 16u);
  EXPECT_NE(std::find(four.begin(), four.end(), "resume"), four.end());
  EXPECT_NE(std::find(four.begin(), four.end(), "empty_cp_shard"), four.end());
  const std::vector<std::string> no_cp = ExpectedChecks(QualifyOptions::Topology(2, 2, 1));
  EXPECT_EQ(no_cp.size(), 15u);
  EXPECT_EQ(std::find(no_cp.begin(), no_cp.end(), "empty_cp_shard"), no_cp.end());
}

TEST(RunQualifyTest, ARankStalledAfterReportingIsNamedAtTheDeadline) {
  for (const bool stall : {false, true}) {
    QualifyOptions options = QualifyOptions::Topology(2, 1, 1);
    options.executable = WriteStubWorker(options, stall);
    options.timeout = absl::Seconds(1);
    options.deadline = absl::Seconds(2);
    std::ostringstream out;
    const Stopwatch start;
    absl::StatusOr<bool> passed = RunQualify(options, out);
    const absl::Duration took = start.Elapsed();
    ASSERT_TRUE(passed.ok()) << passed.status();
    if (!stall) {
      // The control: the same reports without the stall pass.
      EXPECT_TRUE(*passed) << out.str();
      continue;
    }
    EXPECT_FALSE(*passed) << out.str();
    EXPECT_THAT(out.str(), HasSubstr("rank(s) 1 still running after the job deadline of 2s"));
    EXPECT_THAT(out.str(), HasSubstr("FAIL: DP2 x TP1 x CP1"));
    // The deadline, then the grace between SIGTERM and SIGKILL (5 s), and some slack.
    EXPECT_LT(took, absl::Seconds(2 + 5 + 3));
  }
}

}  // namespace
}  // namespace qualification
}  // namespace lockstep
