#include "collectives/internal/host_lane.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/posix_io.h"
#include "base/status_macros.h"
#include "base/status_testutil.h"
#include "base/stopwatch.h"
#include "base/subprocess.h"
#include "collectives/rendezvous.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace collectives {
namespace internal {
namespace {

using ::testing::HasSubstr;

using MemberBody = std::function<absl::Status(int rank, HostLane* lane)>;

// Runs `body` in `size` forked processes that connect a host lane over a FileStore and returns
// each member's status (its code and message, sent back through the child's channel).
std::vector<absl::Status> RunMembers(const std::vector<absl::Duration>& timeouts,
                                     const MemberBody& body,
                                     const std::function<void(int rank)>& before_connect = {}) {
  const int size = static_cast<int>(timeouts.size());
  // POSIX calls, not std::filesystem: its remove_all crashed this test's process on the GPU
  // machine's host (Ubuntu 24.04, the binary built here with GCC 12), every time, right after a
  // member had exited; the cause was not pinned down.
  // mkdtemp replaces the template's trailing XXXXXX with a unique name.
  std::string dir = absl::StrCat(::testing::TempDir(), "/host_lane_test.XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << dir << ": " << std::strerror(errno);
    return {};
  }
  const std::string store = dir + "/store";
  std::vector<Child> children;
  for (int rank = 0; rank < size; ++rank) {
    absl::StatusOr<Child> child =
        Child::Fork(ChildOptions::Reporting(), [&, rank](int channel) -> int {
          absl::Status status = [&]() -> absl::Status {
            absl::StatusOr<std::shared_ptr<Rendezvous>> rendezvous =
                Rendezvous::File(store, rank, size, absl::Seconds(30));
            if (!rendezvous.ok()) return rendezvous.status();
            if (before_connect) before_connect(rank);
            absl::StatusOr<std::unique_ptr<HostLane>> lane =
                HostLane::Connect(**rendezvous, "test/group", rank, size, timeouts[rank]);
            if (!lane.ok()) return lane.status();
            return body(rank, lane->get());
          }();
          const std::string report =
              absl::StrCat(static_cast<int>(status.code()), " ", status.message());
          (void)WriteAll(channel, report);
          return 0;
        });
    if (!child.ok()) {
      ADD_FAILURE() << child.status();
      return {};
    }
    children.push_back(std::move(*child));
  }
  std::vector<std::string> reports(size);
  std::vector<Child*> pointers;
  for (Child& c : children) pointers.push_back(&c);
  while (true) {
    absl::StatusOr<int> open = PollChannels(
        pointers, absl::Seconds(60),
        [&](size_t i, absl::string_view bytes) { reports[i].append(bytes.data(), bytes.size()); });
    if (!open.ok() || *open == 0) break;
  }
  std::vector<absl::Status> statuses;
  for (int rank = 0; rank < size; ++rank) {
    children[rank].Reap();
    const std::vector<std::string> parts = absl::StrSplit(reports[rank], absl::MaxSplits(' ', 1));
    int code = -1;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &code)) {
      statuses.push_back(absl::InternalError(
          absl::StrCat("member ", rank, " ", children[rank].Describe(), " without a report")));
    } else {
      statuses.push_back(absl::Status(static_cast<absl::StatusCode>(code), parts[1]));
    }
  }
  unlink(store.c_str());  // the FileStore's one file
  rmdir(dir.c_str());
  return statuses;
}

// Every member with the same timeout.
std::vector<absl::Status> RunMembers(int size, absl::Duration timeout, const MemberBody& body) {
  return RunMembers(std::vector<absl::Duration>(size, timeout), body);
}

// The byte member `rank` contributes at `index` of round `round`.
uint8_t Pattern(int round, int rank, int64_t index) {
  return static_cast<uint8_t>(round * 131 + rank * 31 + index * 7 + (index >> 8));
}

class HostLaneTest : public ::testing::TestWithParam<int> {};

TEST_P(HostLaneTest, BroadcastAndAllGatherDeliverEveryMembersBytes) {
  const int size = GetParam();
  const std::vector<absl::Status> statuses =
      RunMembers(size, absl::Seconds(30), [size](int rank, HostLane* lane) -> absl::Status {
        if (lane == nullptr) return absl::InternalError("no lane between processes of one host");
        // Sizes that cross cache lines and pages, up to the limit; roots rotate.
        const std::vector<int64_t> sizes = {1, 7, 64, 5073, 4096 + 3, HostLane::kMaxBytes};
        for (int round = 0; round < 600; ++round) {
          const int64_t bytes = sizes[round % sizes.size()];
          if (round % 2 == 0) {
            const int root = (round / 2) % size;
            std::vector<uint8_t> data(bytes, 0);
            if (rank == root) {
              for (int64_t i = 0; i < bytes; ++i) data[i] = Pattern(round, root, i);
            }
            if (absl::Status s = lane->Broadcast(data.data(), bytes, root, "broadcast"); !s.ok()) {
              return s;
            }
            for (int64_t i = 0; i < bytes; ++i) {
              if (data[i] != Pattern(round, root, i)) {
                return absl::DataLossError(absl::StrCat("round ", round, ": broadcast byte ", i,
                                                        " from root ", root, " is ", data[i]));
              }
            }
          } else {
            std::vector<uint8_t> mine(bytes), all(bytes * size, 0);
            for (int64_t i = 0; i < bytes; ++i) mine[i] = Pattern(round, rank, i);
            if (absl::Status s = lane->AllGather(mine.data(), bytes, all.data(), "all-gather");
                !s.ok()) {
              return s;
            }
            for (int r = 0; r < size; ++r) {
              for (int64_t i = 0; i < bytes; ++i) {
                if (all[r * bytes + i] != Pattern(round, r, i)) {
                  return absl::DataLossError(absl::StrCat(
                      "round ", round, ": member ", r, "'s byte ", i, " is ", all[r * bytes + i]));
                }
              }
            }
          }
        }
        return absl::OkStatus();
      });
  ASSERT_EQ(statuses.size(), static_cast<size_t>(size));
  for (int rank = 0; rank < size; ++rank) EXPECT_TRUE(statuses[rank].ok()) << statuses[rank];
}

INSTANTIATE_TEST_SUITE_P(Sizes, HostLaneTest, ::testing::Values(2, 3, 4));

TEST(HostLaneSetupTest, LeavesNothingInDevShm) {
  const std::vector<absl::Status> statuses =
      RunMembers(2, absl::Seconds(30), [](int rank, HostLane* lane) -> absl::Status {
        if (lane == nullptr) return absl::InternalError("no lane");
        // Both members are connected here; rank 0 created the segment under its pid.
        uint8_t byte = 1;
        if (absl::Status s = lane->Broadcast(&byte, 1, 0, "sync"); !s.ok()) return s;
        if (rank != 0) return absl::OkStatus();
        const std::string prefix = absl::StrCat("lockstep-", getpid(), "-");
        DIR* dir = opendir("/dev/shm");
        if (dir == nullptr) return absl::OkStatus();
        std::string left;
        while (dirent* entry = readdir(dir)) {
          if (std::string(entry->d_name).rfind(prefix, 0) == 0) left = entry->d_name;
        }
        closedir(dir);
        return left.empty() ? absl::OkStatus()
                            : absl::InternalError(absl::StrCat("/dev/shm/", left, " is left"));
      });
  for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
}

// Replaces the segment `name` with a forged copy: the same header (magic, token, size) and
// length in other memory, as a stale segment or another host's /dev/shm could hold.
void ForgeSegment(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return;
  struct stat info;
  fstat(fd, &info);
  std::vector<char> bytes(static_cast<size_t>(info.st_size));
  (void)!pread(fd, bytes.data(), bytes.size(), 0);
  close(fd);
  shm_unlink(name.c_str());
  const int forged = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (forged < 0) return;
  (void)!ftruncate(forged, info.st_size);
  (void)!pwrite(forged, bytes.data(), bytes.size(), 0);
  close(forged);
}

// A member that maps a segment of the right name, header and token that is not the first
// member's memory: no member gets a lane (Note [Proof of sharing]), instead of members talking
// past each other.
TEST(HostLaneSetupTest, AForgedSegmentOfTheRightNameGivesNoLane) {
  const std::vector<absl::Status> statuses = RunMembers(
      std::vector<absl::Duration>(2, absl::Seconds(10)),
      [](int rank, HostLane* lane) -> absl::Status {
        return lane == nullptr ? absl::OkStatus()
                               : absl::InternalError(absl::StrCat(
                                     "member ", rank, " got a lane over a forged segment"));
      },
      [](int rank) {
        if (rank == 1) SetBeforeAttachForTesting(&ForgeSegment);
      });
  ASSERT_EQ(statuses.size(), 2u);
  for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
}

TEST(HostLaneSetupTest, AGroupOfOneHasNoLane) {
  const std::vector<absl::Status> statuses =
      RunMembers(1, absl::Seconds(5), [](int, HostLane* lane) -> absl::Status {
        return lane == nullptr ? absl::OkStatus()
                               : absl::InternalError("a group of one got a host lane");
      });
  ASSERT_EQ(statuses.size(), 1u);
  EXPECT_TRUE(statuses[0].ok()) << statuses[0];
}

// Rank 0 broadcasts, rank 1 all-gathers; then each member broadcasts as its own root. Every
// member checks the calls it depends on (the root and all-gather members every member's), so
// both are refused, each member failing with the disagreement or because the other gave up.
TEST(HostLaneErrorTest, MismatchedCollectivesAreRefused) {
  for (const bool own_roots : {false, true}) {
    SCOPED_TRACE(own_roots ? "each its own root" : "broadcast against all-gather");
    const std::vector<absl::Status> statuses =
        RunMembers(2, absl::Seconds(20), [own_roots](int rank, HostLane* lane) -> absl::Status {
          if (lane == nullptr) return absl::InternalError("no lane");
          std::vector<uint8_t> data(16, 0), all(32);
          if (own_roots) return lane->Broadcast(data.data(), 16, rank, "broadcast");
          return rank == 0 ? lane->Broadcast(data.data(), 16, 0, "broadcast")
                           : lane->AllGather(data.data(), 16, all.data(), "all-gather");
        });
    ASSERT_EQ(statuses.size(), 2u);
    for (const absl::Status& s : statuses) {
      EXPECT_TRUE(absl::IsFailedPrecondition(s) || absl::IsUnavailable(s)) << s;
    }
    EXPECT_TRUE(absl::IsFailedPrecondition(statuses[0]) || absl::IsFailedPrecondition(statuses[1]));
    for (const absl::Status& s : statuses) {
      if (absl::IsFailedPrecondition(s)) {
        EXPECT_THAT(s.message(), HasSubstr("members called different collectives"));
      }
    }
  }

  // Two all-gathers of different sizes, or of different tags (an all-reduce built on one
  // against an all-gather), are refused on both members.
  for (const bool tags : {false, true}) {
    const std::vector<absl::Status> gathers =
        RunMembers(2, absl::Seconds(20), [tags](int rank, HostLane* lane) -> absl::Status {
          if (lane == nullptr) return absl::InternalError("no lane");
          std::vector<uint8_t> data(16, 0), all(32);
          if (tags) return lane->AllGather(data.data(), 16, all.data(), "all-gather", rank);
          return lane->AllGather(data.data(), 8 + 8 * rank, all.data(), "all-gather");
        });
    ASSERT_EQ(gathers.size(), 2u);
    EXPECT_TRUE(absl::IsFailedPrecondition(gathers[0]) || absl::IsFailedPrecondition(gathers[1]));
    for (const absl::Status& s : gathers) {
      EXPECT_TRUE(absl::IsFailedPrecondition(s) || absl::IsUnavailable(s)) << s;
    }
  }
}

// Note [Lane or group]: a member that announces a collective through the group while another
// calls one on the lane is refused on both sides within moments, naming both calls; members
// that all announce the same go on (and later rounds still work).
TEST(HostLaneErrorTest, MembersSplitBetweenTheLaneAndTheGroupAreRefused) {
  Stopwatch watch;
  const std::vector<absl::Status> split =
      RunMembers(2, absl::Seconds(20), [](int rank, HostLane* lane) -> absl::Status {
        if (lane == nullptr) return absl::InternalError("no lane");
        std::vector<uint8_t> data(64, 0), all(128);
        if (rank == 0) return lane->AllGather(data.data(), 64, all.data(), "all-gather", 7);
        return lane->Announce(160000, "all-gather", 7);
      });
  ASSERT_EQ(split.size(), 2u);
  EXPECT_LT(watch.Elapsed(), absl::Seconds(10));
  EXPECT_TRUE(absl::IsFailedPrecondition(split[0]) || absl::IsFailedPrecondition(split[1]));
  for (const absl::Status& s : split) {
    EXPECT_TRUE(absl::IsFailedPrecondition(s) || absl::IsUnavailable(s)) << s;
    if (absl::IsFailedPrecondition(s)) {
      EXPECT_THAT(s.message(), HasSubstr("160000 bytes per member through the group"));
      EXPECT_THAT(s.message(), HasSubstr("all-gather of 64 bytes per member"));
    }
  }
  const std::vector<absl::Status> agreed =
      RunMembers(2, absl::Seconds(20), [](int rank, HostLane* lane) -> absl::Status {
        if (lane == nullptr) return absl::InternalError("no lane");
        LOCKSTEP_RETURN_IF_ERROR(lane->Announce(160000, "all-gather", 7));
        std::vector<uint8_t> data(16, static_cast<uint8_t>(rank)), all(32);
        LOCKSTEP_RETURN_IF_ERROR(lane->AllGather(data.data(), 16, all.data(), "all-gather"));
        return all[0] == 0 && all[16] == 1 ? absl::OkStatus() : absl::InternalError("wrong bytes");
      });
  for (const absl::Status& s : agreed) LOCKSTEP_EXPECT_OK(s);
}

// Each of the lane's collectives with a peer that is alive but never calls: kDeadlineExceeded
// within the lane's timeout, long before the sleeping peer would arrive.
TEST(HostLaneErrorTest, AbsentPeerIsADeadlineWithinTheTimeoutForEveryCollective) {
  for (const bool all_gather : {false, true}) {
    SCOPED_TRACE(all_gather ? "all-gather" : "broadcast");
    std::vector<int64_t> took(2, 0);
    const std::vector<absl::Status> statuses =
        RunMembers(2, absl::Milliseconds(300), [&](int rank, HostLane* lane) -> absl::Status {
          if (lane == nullptr) return absl::InternalError("no lane");
          if (rank == 1) {
            absl::SleepFor(absl::Seconds(3));  // alive, but never calls
            return absl::OkStatus();
          }
          const Stopwatch start;
          uint8_t byte = 0, gathered[2] = {0, 0};
          absl::Status s = all_gather ? lane->AllGather(&byte, 1, gathered, "all-gather")
                                      : lane->Broadcast(&byte, 1, 1, "broadcast from rank 1");
          if (start.Elapsed() > absl::Seconds(2)) {
            return absl::InternalError(absl::StrCat("took ", absl::FormatDuration(start.Elapsed()),
                                                    " against a timeout of 300 ms"));
          }
          return s;
        });
    ASSERT_EQ(statuses.size(), 2u);
    EXPECT_TRUE(absl::IsDeadlineExceeded(statuses[0])) << statuses[0];
    EXPECT_THAT(std::string(statuses[0].message()), HasSubstr("waiting for rank 1"));
  }
}

TEST(HostLaneErrorTest, AMemberThatGaveUpReleasesTheOthersBeforeTheirTimeout) {
  // Rank 2 is alive but never calls. Rank 0 (300 ms timeout) gives up first; rank 1 (100 s) must
  // then fail at once instead of waiting out its own timeout.
  const auto start = std::chrono::steady_clock::now();
  const std::vector<absl::Status> statuses =
      RunMembers({absl::Milliseconds(300), absl::Seconds(100), absl::Seconds(100)},
                 [](int rank, HostLane* lane) -> absl::Status {
                   if (lane == nullptr) return absl::InternalError("no lane");
                   if (rank == 2) {
                     absl::SleepFor(absl::Seconds(5));
                     return absl::OkStatus();
                   }
                   uint8_t byte = 0;
                   return lane->Broadcast(&byte, 1, 2, "broadcast from rank 2");
                 });
  ASSERT_EQ(statuses.size(), 3u);
  EXPECT_TRUE(absl::IsDeadlineExceeded(statuses[0])) << statuses[0];
  EXPECT_TRUE(absl::IsUnavailable(statuses[1])) << statuses[1];
  EXPECT_THAT(statuses[1].message(), HasSubstr("rank 0 of the group gave up after an error"));
  // Bounded by the sleeping rank 2 (5 s), far inside rank 1's 100 s timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(50));
}

TEST(HostLaneErrorTest, ExitedPeerIsUnavailableBeforeTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<absl::Status> statuses =
      RunMembers(2, absl::Seconds(100), [](int rank, HostLane* lane) -> absl::Status {
        if (lane == nullptr) return absl::InternalError("no lane");
        if (rank == 1) _exit(0);  // dies without a report
        uint8_t byte = 0;
        return lane->Broadcast(&byte, 1, 1, "broadcast from rank 1");
      });
  ASSERT_EQ(statuses.size(), 2u);
  EXPECT_TRUE(absl::IsUnavailable(statuses[0])) << statuses[0];
  EXPECT_THAT(statuses[0].message(), HasSubstr("has exited"));
  // Well inside the 100 s timeout: the liveness check noticed the exit.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(50));
}

TEST(HostLaneErrorTest, OversizedAndBadRootAreRefusedAndLaterCallsStillWork) {
  const std::vector<absl::Status> statuses =
      RunMembers(2, absl::Seconds(20), [](int rank, HostLane* lane) -> absl::Status {
        if (lane == nullptr) return absl::InternalError("no lane");
        std::vector<uint8_t> big(HostLane::kMaxBytes + 1);
        absl::Status too_big = lane->Broadcast(big.data(), HostLane::kMaxBytes + 1, 0, "big");
        if (!absl::IsInvalidArgument(too_big) ||
            too_big.message().find(absl::StrCat(HostLane::kMaxBytes + 1)) == std::string::npos) {
          return absl::InternalError(absl::StrCat("oversized: ", too_big.ToString()));
        }
        absl::Status bad_root = lane->Broadcast(big.data(), 1, 2, "bad root");
        if (!absl::IsInvalidArgument(bad_root)) {
          return absl::InternalError(absl::StrCat("bad root: ", bad_root.ToString()));
        }
        uint8_t byte = rank == 0 ? 42 : 0;
        if (absl::Status s = lane->Broadcast(&byte, 1, 0, "after"); !s.ok()) return s;
        return byte == 42 ? absl::OkStatus() : absl::DataLossError("stale byte after refusals");
      });
  for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace internal
}  // namespace collectives
}  // namespace lockstep
