#include "testing/process_world.h"

#include <unistd.h>

#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/stopwatch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace collectives {
namespace {

using ::testing::HasSubstr;

TEST(ProcessWorldTest, EachRankReportsItsOwnStatus) {
  std::vector<absl::Status> results =
      RunProcessWorld({3}, [](int rank, collectives::Communicator& world) {
        if (world.rank() != rank || world.size() != 3) return absl::InternalError("identity");
        if (rank == 1) return absl::NotFoundError(absl::StrCat("rank ", rank, " says hello"));
        return absl::OkStatus();
      });
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_EQ(results[1], absl::NotFoundError("rank 1 says hello"));
  EXPECT_TRUE(results[2].ok()) << results[2];
}

TEST(ProcessWorldTest, ProcessesHaveTheirOwnDefaultGenerator) {
  // Each process seeds its own default generator; if the processes shared one (threads), the
  // draws would interleave and the per-rank values would not match a fresh seeded draw.
  std::vector<absl::Status> results =
      RunProcessWorld({2}, [](int rank, collectives::Communicator&) {
        at::manual_seed(1000 + rank);
        at::Tensor first = at::rand({4});
        at::manual_seed(1000 + rank);
        if (!at::equal(first, at::rand({4}))) return absl::InternalError("not reproducible");
        return absl::OkStatus();
      });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

TEST(ProcessWorldTest, CrashAndEarlyExitAreReportedPerRank) {
  std::vector<absl::Status> results =
      RunProcessWorld({3}, [](int rank, collectives::Communicator&) {
        if (rank == 1) _exit(7);
        if (rank == 2) abort();
        return absl::OkStatus();
      });
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_EQ(results[1].code(), absl::StatusCode::kAborted);
  EXPECT_THAT(results[1].message(), HasSubstr("exited with code 7"));
  EXPECT_THAT(results[2].message(), HasSubstr("killed by signal 6"));
}

TEST(ProcessWorldTest, StragglersAreKilledAtTheDeadline) {
  ProcessWorldOptions options;
  options.world_size = 2;
  options.deadline = absl::Seconds(3);
  const Stopwatch start;
  std::vector<absl::Status> results =
      RunProcessWorld(options, [](int rank, collectives::Communicator&) {
        if (rank == 0) sleep(60);
        return absl::OkStatus();
      });
  EXPECT_LT(start.Elapsed(), absl::Seconds(15));
  EXPECT_EQ(results[0].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(results[1].ok());
}

}  // namespace
}  // namespace collectives
}  // namespace lockstep
