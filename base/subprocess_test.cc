// base/subprocess: forked bodies and exec'd programs, their channels, exit descriptions,
// signals, the kill-on-destruction rule and death with the parent.

#include "base/subprocess.h"
#include "base/stopwatch.h"

#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/posix_io.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;

// Whether `pid` is a live process (a zombie waiting for a reaper counts as dead).
bool Alive(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z' &&
         line[paren + 2] != 'X';
}

// Reads every channel to its end (or until `limit`), returning each child's bytes.
std::vector<std::string> Drain(std::vector<Child*> children, absl::Duration limit) {
  std::vector<std::string> out(children.size());
  const Stopwatch clock;
  for (;;) {
    absl::StatusOr<int> open = PollChannels(
        children, limit - clock.Elapsed(),
        [&](size_t i, absl::string_view bytes) { out[i].append(bytes.data(), bytes.size()); });
    if (!open.ok() || *open == 0 || clock.Elapsed() >= limit) break;
  }
  return out;
}

TEST(SubprocessTest, ForkedBodiesReportThroughTheirChannelAndExitCode) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Child ok, Child::Fork(ChildOptions::Reporting(), [](int fd) {
                                  WriteAll(fd, "report of the first child");
                                  return 0;
                                }));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Child failing, Child::Fork(ChildOptions::Reporting(), [](int fd) {
                                  WriteAll(fd, "second");
                                  return 3;
                                }));
  const std::vector<std::string> reports = Drain({&ok, &failing}, absl::Seconds(20));
  EXPECT_EQ(reports[0], "report of the first child");
  EXPECT_EQ(reports[1], "second");
  ok.Reap();
  failing.Reap();
  EXPECT_TRUE(ok.succeeded());
  EXPECT_EQ(ok.Describe(), "exited with code 0");
  EXPECT_FALSE(failing.succeeded());
  EXPECT_EQ(failing.ExitCode(), 3);
  EXPECT_EQ(failing.Describe(), "exited with code 3");
}

TEST(SubprocessTest, ExecCapturesOutputAndEnvironment) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      Child child, Child::Exec(ChildOptions::Output(),
                               {"sh", "-c", "echo out $LOCKSTEP_TEST_VALUE; echo err >&2; exit 4"},
                               {{"LOCKSTEP_TEST_VALUE", "forty-two"}}));
  const std::vector<std::string> output = Drain({&child}, absl::Seconds(20));
  child.Reap();
  EXPECT_THAT(output[0], HasSubstr("out forty-two\n"));
  EXPECT_THAT(output[0], HasSubstr("err\n"));
  EXPECT_EQ(child.ExitCode(), 4);
}

TEST(SubprocessTest, AProgramThatCannotStartExits127SayingWhy) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      Child child,
      Child::Exec(ChildOptions::Output(), {"/nonexistent/lockstep-no-such-program"}, {}));
  const std::vector<std::string> output = Drain({&child}, absl::Seconds(20));
  child.Reap();
  EXPECT_EQ(child.ExitCode(), 127);
  EXPECT_THAT(output[0], HasSubstr("cannot run /nonexistent/lockstep-no-such-program"));
  EXPECT_FALSE(Child::Exec(ChildOptions::Output(), {}, {}).ok());
}

TEST(SubprocessTest, SignalsAreDescribedAndReachTheWholeGroup) {
  ChildOptions options = ChildOptions::Output();
  options.own_process_group = true;
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      Child child, Child::Exec(options, {"sh", "-c", "sleep 60 & echo started; wait"}, {}));
  std::string first;
  while (first.find("started") == std::string::npos) {
    ASSERT_TRUE(PollChannels({&child}, absl::Seconds(20), [&](size_t, absl::string_view b) {
                  first.append(b.data(), b.size());
                }).ok());
  }
  EXPECT_FALSE(child.TryReap());
  child.Signal(SIGTERM);
  // The group's sleep got the signal too, so the pipe closes (no writer is left).
  Drain({&child}, absl::Seconds(20));
  EXPECT_EQ(child.channel(), -1);
  child.Reap();
  EXPECT_EQ(child.ExitCode(), 128 + SIGTERM);
  EXPECT_THAT(child.Describe(), HasSubstr("was killed by signal 15"));
}

TEST(SubprocessTest, DestroyingARunningChildKillsAndReapsIt) {
  pid_t pid = -1;
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(Child child, Child::Fork(ChildOptions::Reporting(), [](int) {
                                    pause();
                                    return 0;
                                  }));
    pid = child.pid();
    EXPECT_TRUE(Alive(pid));
  }
  EXPECT_FALSE(Alive(pid)) << "the child outlived its Child";
}

// A middle process starts a grandchild and reports its pid; when the middle process is killed,
// the grandchild must die with it.
TEST(SubprocessTest, ChildrenDieWithTheirParent) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Child middle, Child::Fork(ChildOptions::Reporting(), [](int fd) {
                                  absl::StatusOr<Child> grandchild =
                                      Child::Fork(ChildOptions::Reporting(), [](int) {
                                        pause();
                                        return 0;
                                      });
                                  if (!grandchild.ok()) return 1;
                                  WriteAll(fd, absl::StrCat(grandchild->pid(), "\n"));
                                  pause();
                                  return 0;
                                }));
  std::string report;
  while (report.find('\n') == std::string::npos) {
    ASSERT_TRUE(PollChannels({&middle}, absl::Seconds(20), [&](size_t, absl::string_view b) {
                  report.append(b.data(), b.size());
                }).ok());
    ASSERT_GE(middle.channel(), 0) << "the middle process ended early";
  }
  int grandchild = 0;
  ASSERT_TRUE(absl::SimpleAtoi(report.substr(0, report.find('\n')), &grandchild));
  ASSERT_TRUE(Alive(grandchild));
  middle.Signal(SIGKILL);
  middle.Reap();
  const Stopwatch clock;
  while (Alive(grandchild) && clock.Elapsed() < absl::Seconds(20))
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_FALSE(Alive(grandchild)) << "the grandchild outlived its parent";
}

}  // namespace
}  // namespace lockstep
