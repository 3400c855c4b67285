#include "launch/launcher.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/stopwatch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace launch {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Runs `script` with /bin/sh in `nproc` ranks and returns the result and the captured output.
std::pair<LaunchResult, std::string> RunShell(int nproc, const std::string& script,
                                              absl::Duration grace = absl::Seconds(5)) {
  const std::string path = absl::StrCat(testing::TempDir(), "/launch_out_", getpid(), "_",
                                        testing::UnitTest::GetInstance()->random_seed(), "_",
                                        std::hash<std::string>()(script));
  const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  EXPECT_GE(fd, 0);
  LaunchOptions options;
  options.nproc = nproc;
  options.command = {"/bin/sh", "-c", script};
  options.grace = grace;
  options.output_fd = fd;
  absl::StatusOr<LaunchResult> result = Launch(options);
  close(fd);
  EXPECT_TRUE(result.ok()) << result.status();
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return {result.ok() ? *result : LaunchResult{}, text.str()};
}

TEST(LauncherTest, SetsTheTorchrunEnvironmentAndPrefixesOutput) {
  auto [result, output] =
      RunShell(3,
               "echo \"env $RANK/$WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE at "
               "$MASTER_ADDR:$MASTER_PORT\"; printf 'no newline'");
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(result.failed_rank, -1);
  for (int r = 0; r < 3; ++r) {
    EXPECT_THAT(output, HasSubstr(absl::StrCat("[rank ", r, "] env ", r, "/3 local ", r,
                                               "/3 at 127.0.0.1:")));
    EXPECT_THAT(output, HasSubstr(absl::StrCat("[rank ", r, "] no newline\n")));
  }
}

// One node of a multi-node job: its ranks are numbered after the earlier nodes', and know the
// node and the job's shape (torchrun's static rendezvous numbering).
TEST(LauncherTest, ANodeOfSeveralNumbersItsRanksAfterTheEarlierNodes) {
  const std::string path = absl::StrCat(testing::TempDir(), "/launch_node_", getpid());
  const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  LaunchOptions options;
  options.nproc = 2;
  options.nnodes = 3;
  options.node_rank = 1;
  options.master_addr = "10.0.0.1";
  options.master_port = 29500;
  // Local rank 1 fails, which stops the others: it waits until local rank 0 has written its line.
  const std::string printed = path + ".printed";
  options.command = {
      "/bin/sh", "-c",
      absl::StrCat("echo \"$RANK/$WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE node "
                   "$GROUP_RANK/$GROUP_WORLD_SIZE at $MASTER_ADDR:$MASTER_PORT\"; "
                   "if [ $LOCAL_RANK = 0 ]; then touch '",
                   printed, "'; else while [ ! -f '", printed,
                   "' ]; do sleep 0.01; done; fi; exit $LOCAL_RANK")};
  options.output_fd = fd;
  absl::StatusOr<LaunchResult> result = Launch(options);
  close(fd);
  ASSERT_TRUE(result.ok()) << result.status();
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("[rank 2] 2/6 local 0/2 node 1/3 at 10.0.0.1:29500"));
  EXPECT_THAT(text.str(), HasSubstr("[rank 3] 3/6 local 1/2 node 1/3 at 10.0.0.1:29500"));
  // The failing rank is named by its global rank.
  EXPECT_EQ(result->failed_rank, 3);
  EXPECT_THAT(result->summary, HasSubstr("rank 3 exited with code 1"));
}

// Progress a rank redraws with '\r' is forwarded as it is written, not held until a '\n' that never
// comes: the rank waits until the launcher's output shows its first state. A "\r\n" split over two
// writes still ends one line.
TEST(LauncherTest, ProgressWithCarriageReturnsIsShownAsItIsWritten) {
  const std::string path = absl::StrCat(testing::TempDir(), "/launch_progress_", getpid());
  const std::string shown = path + ".shown";
  const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  LaunchOptions options;
  options.nproc = 1;
  options.output_fd = fd;
  options.deadline = absl::Seconds(60);
  options.command = {"/bin/sh", "-c",
                     absl::StrCat("printf 'step 1\\r'; i=0; while [ ! -f '", shown,
                                  "' ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done; "
                                  "printf 'step 2\\r'; sleep 0.1; printf '\\nend'")};
  absl::StatusOr<LaunchResult> result;
  std::thread launcher([&] { result = Launch(options); });
  bool seen = false;
  for (int i = 0; i < 500 && !seen; ++i) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    seen = text.str().find("[rank 0] step 1\r") != std::string::npos;
    if (!seen) absl::SleepFor(absl::Milliseconds(10));
  }
  std::ofstream(shown) << "";
  launcher.join();
  close(fd);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(seen) << "the first progress state was not forwarded while the rank ran";
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "[rank 0] step 1\r[rank 0] step 2\r\n[rank 0] end\n");
}

// A rank that writes megabytes without a line end is forwarded in bounded pieces, every byte kept.
TEST(LauncherTest, OutputWithoutLineEndsIsForwardedInBoundedPieces) {
  std::istringstream in(RunShell(1, "head -c 4194304 /dev/zero | tr '\\0' x").second);
  std::string line;
  int64_t bytes = 0, pieces = 0;
  size_t longest = 0;
  while (std::getline(in, line)) {
    ASSERT_EQ(line.rfind("[rank 0] ", 0), 0u) << line.substr(0, 40);
    const size_t n = line.size() - 9;
    bytes += n;
    longest = std::max(longest, n);
    ++pieces;
  }
  EXPECT_EQ(bytes, 4194304);
  EXPECT_EQ(longest, size_t{64} << 10);
  EXPECT_EQ(pieces, 64);
}

TEST(LauncherTest, AllRanksShareOnePort) {
  auto [result, output] = RunShell(2, "echo port=$MASTER_PORT");
  const size_t a = output.find("port=");
  const size_t b = output.find("port=", a + 1);
  ASSERT_NE(b, std::string::npos);
  EXPECT_EQ(output.substr(a, output.find('\n', a) - a), output.substr(b, output.find('\n', b) - b));
}

TEST(LauncherTest, FailureStopsTheOthersAndPropagatesTheExitCode) {
  const Stopwatch start;
  auto [result, output] =
      RunShell(3, "if [ \"$RANK\" = 1 ]; then echo failing; exit 3; fi; sleep 30; echo survived");
  EXPECT_LT(start.Elapsed(), absl::Seconds(20));
  EXPECT_EQ(result.exit_code, 3);
  EXPECT_EQ(result.failed_rank, 1);
  EXPECT_EQ(result.summary, "rank 1 exited with code 3");
  EXPECT_THAT(output, HasSubstr("[rank 1] failing"));
  EXPECT_THAT(output, HasSubstr("[launch] rank 1 exited with code 3; stopping the other ranks"));
  EXPECT_THAT(output, Not(HasSubstr("survived")));
}

TEST(LauncherTest, RanksIgnoringSigtermAreKilledAfterTheGrace) {
  const Stopwatch start;
  auto [result, output] = RunShell(
      2, "if [ \"$RANK\" = 0 ]; then exit 5; fi; trap '' TERM; sleep 30", absl::Seconds(1));
  EXPECT_LT(start.Elapsed(), absl::Seconds(20));
  EXPECT_EQ(result.exit_code, 5);
  EXPECT_EQ(result.failed_rank, 0);
}

TEST(LauncherTest, DeathBySignalIsReportedAs128PlusSignal) {
  auto [result, output] = RunShell(2, "if [ \"$RANK\" = 1 ]; then kill -9 $$; fi; sleep 30");
  EXPECT_EQ(result.exit_code, 128 + 9);
  EXPECT_EQ(result.failed_rank, 1);
  EXPECT_THAT(result.summary, HasSubstr("killed by signal 9"));
}

TEST(LauncherTest, MissingProgramFailsWithExitCode127) {
  LaunchOptions options;
  options.nproc = 1;
  options.command = {"/nonexistent/program"};
  options.output_fd = open("/dev/null", O_WRONLY);
  absl::StatusOr<LaunchResult> result = Launch(options);
  close(options.output_fd);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->exit_code, 127);
}

TEST(LauncherTest, ADeadlineStopsAndNamesTheStalledRanks) {
  LaunchOptions options;
  options.nproc = 3;
  // Rank 1 stalls; the others finish at once.
  options.command = {"/bin/sh", "-c", "if [ \"$RANK\" = 1 ]; then sleep 60; fi; echo done $RANK"};
  options.deadline = absl::Seconds(2);
  options.grace = absl::Seconds(1);
  options.output_fd = open("/dev/null", O_WRONLY);
  const Stopwatch start;
  absl::StatusOr<LaunchResult> result = Launch(options);
  close(options.output_fd);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_LT(start.Elapsed(), options.deadline + options.grace + absl::Seconds(5));
  EXPECT_EQ(result->exit_code, 124);
  EXPECT_EQ(result->stalled_ranks, (std::vector<int>{1}));
  EXPECT_THAT(result->summary, HasSubstr("rank(s) 1 still running after the job deadline of 2s"));
}

TEST(ValidateLaunchOptionsTest, BadOptionsAreNamedWithTheirRange) {
  auto with = [](auto change) {
    LaunchOptions options;
    options.command = {"prog"};
    change(options);
    return ValidateLaunchOptions(options);
  };
  EXPECT_TRUE(with([](LaunchOptions&) {}).ok());
  EXPECT_THAT(with([](LaunchOptions& o) { o.nproc = 0; }).message(),
              HasSubstr("--nproc 0 is not an integer in [1, 1024]"));
  EXPECT_THAT(with([](LaunchOptions& o) { o.nproc = 1025; }).message(),
              HasSubstr("--nproc 1025 is not an integer in [1, 1024]"));
  EXPECT_THAT(with([](LaunchOptions& o) { o.command.clear(); }).message(), HasSubstr("no program"));
  EXPECT_THAT(with([](LaunchOptions& o) { o.nnodes = 0; }).message(),
              HasSubstr("--nnodes 0 is not an integer in [1, 1024]"));
  EXPECT_THAT(with([](LaunchOptions& o) {
                o.nnodes = 2;
                o.node_rank = 2;
                o.master_port = 29500;
              }).message(),
              HasSubstr("--node_rank 2 is not an integer in [0, 2)"));
  EXPECT_THAT(with([](LaunchOptions& o) { o.nnodes = 2; }).message(),
              HasSubstr("--master_port must be given with --nnodes 2"));
  EXPECT_THAT(with([](LaunchOptions& o) { o.master_port = 70000; }).message(),
              HasSubstr("--master_port 70000"));
  EXPECT_THAT(with([](LaunchOptions& o) { o.master_addr = ""; }).message(),
              HasSubstr("--master_addr is empty"));
  EXPECT_THAT(with([](LaunchOptions& o) { o.deadline = absl::ZeroDuration(); }).message(),
              HasSubstr("--deadline_seconds 0 must be positive"));
  EXPECT_EQ(Launch([] {
              LaunchOptions o;
              o.nproc = 0;
              o.command = {"prog"};
              return o;
            }())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace launch
}  // namespace lockstep
