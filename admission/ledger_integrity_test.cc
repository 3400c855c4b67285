// The recovery ledger against hostile files (issue 31): a WAL left by another ledger, a damaged or
// missing WAL, an edited schema, creation on a full disk, files that are not ledgers, another DP
// rank's writer, a lost head. Each is refused (kDataLoss for what was a ledger and no longer
// holds what it committed) and left as found; none is ever OK with less than was committed.

#include <signal.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "admission/ledger.h"
#include "base/status_macros.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace admission {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/integrity_", name, "_", getpid());
  RemoveLedgerFiles(path);
  return path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

bool Exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

std::vector<PlannedMicrobatch> Work() {
  return {PlannedMicrobatch::Of("0", {{0, 0, 50}}), PlannedMicrobatch::Of("1", {{0, 50, 100}})};
}

absl::Status RunStep(Ledger& ledger, int64_t step) {
  LOCKSTEP_RETURN_IF_ERROR(ledger.BeginStep(step, Work()));
  for (const PlannedMicrobatch& m : Work()) {
    LOCKSTEP_RETURN_IF_ERROR(
        ledger.Record(LedgerEvent::Of(LedgerEventKind::kCompleted, step, m.id, m.ranges)).status());
  }
  return ledger.CommitStep(step);
}

// The files a writer killed mid-run leaves: a copy of the database, its WAL (holding the steps'
// frames: no checkpoint has run) and its head, taken while the writer is open after `steps` steps.
void KilledWriterFiles(const std::string& path, int dp_rank, int steps, const std::string& into) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Ledger> ledger,
                                Ledger::OpenWriter(path, LedgerOptions::Of(dp_rank)));
  for (int s = 0; s < steps; ++s) LOCKSTEP_ASSERT_OK(RunStep(*ledger, s));
  RemoveLedgerFiles(into);
  for (const char* suffix : {"", "-wal", "-head"}) {
    WriteFile(absl::StrCat(into, suffix), ReadFile(absl::StrCat(path, suffix)));
  }
  ASSERT_GT(ReadFile(absl::StrCat(into, "-wal")).size(), 32u) << "the WAL holds the steps";
}

// The ledger's files as bytes, to show a refused open left them as found.
std::string Snapshot(const std::string& path) {
  return absl::StrCat(ReadFile(path), "|", ReadFile(absl::StrCat(path, "-wal")), "|",
                      ReadFile(absl::StrCat(path, "-head")));
}

void ExpectRefusedAsDataLoss(const std::string& path, absl::string_view says) {
  const std::string before = Snapshot(path);
  const absl::Status replay = Ledger::Replay(path).status();
  EXPECT_EQ(replay.code(), absl::StatusCode::kDataLoss) << replay;
  EXPECT_THAT(replay.message(), HasSubstr(says)) << replay;
  EXPECT_THAT(replay.message(), HasSubstr(path));
  const absl::Status writer = Ledger::OpenWriter(path, LedgerOptions::Of(0)).status();
  EXPECT_EQ(writer.code(), absl::StatusCode::kDataLoss) << writer;
  EXPECT_EQ(Snapshot(path), before) << "a refused ledger must be left as found";
}

// Another DP rank's writer was killed mid-run and its WAL lies beside this rank's ledger: SQLite
// would apply it and the rank's own committed steps would be gone for good.
TEST(LedgerIntegrityTest, AWalLeftByAnotherLedgerIsRefusedAndKept) {
  const std::string mine = TempPath("mine"), theirs = TempPath("theirs");
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Ledger> ledger,
                                  Ledger::OpenWriter(mine, LedgerOptions::Of(0)));
    for (int s = 0; s < 3; ++s) LOCKSTEP_ASSERT_OK(RunStep(*ledger, s));
  }  // closed: checkpointed, no WAL
  // Another rank's: its events are not this rank's.
  KilledWriterFiles(TempPath("theirs_live"), 1, 5, theirs);
  WriteFile(absl::StrCat(mine, "-wal"), ReadFile(absl::StrCat(theirs, "-wal")));
  ExpectRefusedAsDataLoss(mine, "is of DP rank 1; the ledger is DP rank 0's");
  // Another job's rank 0 (a copied directory): its events do not chain from this ledger's start.
  const std::string other_job = TempPath("other_job");
  KilledWriterFiles(TempPath("other_job_live"), 0, 5, other_job);
  WriteFile(absl::StrCat(mine, "-wal"), ReadFile(absl::StrCat(other_job, "-wal")));
  unlink(absl::StrCat(mine, "-shm").c_str());
  ExpectRefusedAsDataLoss(mine, "does not match its chain");
  // The rank's own history is intact once the foreign WAL is moved away.
  unlink(absl::StrCat(mine, "-wal").c_str());
  unlink(absl::StrCat(mine, "-shm").c_str());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LedgerReplay replay, Ledger::Replay(mine));
  EXPECT_EQ(replay.LastCommittedStep(0), 2);
}

// One flipped bit in a committed WAL frame ends the WAL there for SQLite.
TEST(LedgerIntegrityTest, ADamagedOrMissingWalFrameIsRefusedNeverOkWithLess) {
  const std::string killed = TempPath("killed");
  KilledWriterFiles(TempPath("live"), 0, 6, killed);
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(LedgerReplay intact, Ledger::Replay(killed));
    EXPECT_EQ(intact.LastCommittedStep(0), 5);
  }
  const std::string wal = ReadFile(absl::StrCat(killed, "-wal"));
  // Frames are 24 header bytes and a 4096-byte page after the 32-byte WAL header; flip a bit in
  // the page of a frame half way through.
  const size_t frames = (wal.size() - 32) / (24 + 4096);
  ASSERT_GE(frames, 4u);
  std::string damaged = wal;
  damaged[32 + (frames / 2) * (24 + 4096) + 24 + 100] ^= 0x10;
  const std::string flipped = TempPath("flipped");
  RemoveLedgerFiles(flipped);
  WriteFile(flipped, ReadFile(killed));
  WriteFile(absl::StrCat(flipped, "-head"), ReadFile(absl::StrCat(killed, "-head")));
  WriteFile(absl::StrCat(flipped, "-wal"), damaged);
  ExpectRefusedAsDataLoss(flipped, "damaged, missing or another's");
  // No WAL at all: the database alone holds none of the steps the head says were committed.
  unlink(absl::StrCat(flipped, "-wal").c_str());
  unlink(absl::StrCat(flipped, "-shm").c_str());
  ExpectRefusedAsDataLoss(flipped, "damaged, missing or another's");
}

TEST(LedgerIntegrityTest, TheHeadMustBeThereOnceSomethingWasCommitted) {
  const std::string path = TempPath("headless");
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Ledger> ledger,
                                  Ledger::OpenWriter(path, LedgerOptions::Of(0)));
    LOCKSTEP_ASSERT_OK(RunStep(*ledger, 0));
  }
  const std::string head = ReadFile(absl::StrCat(path, "-head"));
  unlink(absl::StrCat(path, "-head").c_str());
  ExpectRefusedAsDataLoss(path, "no head record");
  // A head whose database is gone says history was lost.
  WriteFile(absl::StrCat(path, "-head"), head);
  unlink(path.c_str());
  EXPECT_EQ(Ledger::Replay(path).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Ledger::OpenWriter(path, LedgerOptions::Of(0)).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_FALSE(Exists(path)) << "no ledger was created over lost history";
  // A damaged head: both slots.
  WriteFile(absl::StrCat(path, "-head"), std::string(1024, 'x'));
  EXPECT_EQ(Ledger::Replay(path).status().code(), absl::StatusCode::kDataLoss);
}

// A creation cut short after the database was published, before its head: nothing was committed,
// so the next writer gives it its head.
TEST(LedgerIntegrityTest, ALedgerWithoutEventsGetsItsHeadBack) {
  const std::string path = TempPath("fresh");
  { LOCKSTEP_ASSERT_OK(Ledger::OpenWriter(path, LedgerOptions::Of(2)).status()); }
  unlink(absl::StrCat(path, "-head").c_str());
  LOCKSTEP_ASSERT_OK(Ledger::Replay(path).status());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Ledger> ledger,
                                Ledger::OpenWriter(path, LedgerOptions::Of(2)));
  LOCKSTEP_ASSERT_OK(RunStep(*ledger, 0));
  EXPECT_TRUE(Exists(absl::StrCat(path, "-head")));
}

TEST(LedgerIntegrityTest, AnotherRanksWriterIsRefused) {
  const std::string path = TempPath("rank");
  { LOCKSTEP_ASSERT_OK(Ledger::OpenWriter(path, LedgerOptions::Of(0)).status()); }
  const absl::Status other = Ledger::OpenWriter(path, LedgerOptions::Of(1)).status();
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition) << other;
  EXPECT_THAT(other.message(), HasSubstr("is DP rank 0's; this writer is DP rank 1"));
}

// A directory, a loop of links and another SQLite file carrying the ledger's identifiers: each
// says what the path is, with a code the caller can act on.
TEST(LedgerIntegrityTest, PathsThatAreNotLedgersSayWhatTheyAre) {
  const std::string dir = TempPath("dir");
  mkdir(dir.c_str(), 0755);
  for (auto open : {+[](const std::string& p) { return Ledger::Replay(p).status(); },
                    +[](const std::string& p) {
                      return Ledger::OpenWriter(p, LedgerOptions::Of(0)).status();
                    }}) {
    const absl::Status directory = open(dir);
    EXPECT_EQ(directory.code(), absl::StatusCode::kInvalidArgument) << directory;
    EXPECT_THAT(directory.message(), HasSubstr("is a directory, not a ledger file"));
  }
  const std::string a = TempPath("loop_a"), b = TempPath("loop_b");
  ASSERT_EQ(symlink(b.c_str(), a.c_str()), 0);
  ASSERT_EQ(symlink(a.c_str(), b.c_str()), 0);
  const absl::Status loop = Ledger::OpenWriter(a, LedgerOptions::Of(0)).status();
  EXPECT_EQ(loop.code(), absl::StatusCode::kInvalidArgument) << loop;
  EXPECT_THAT(loop.message(), HasSubstr("symbolic links"));
  EXPECT_EQ(Ledger::Replay(a).status().code(), absl::StatusCode::kInvalidArgument);

  // The identifiers of a ledger on a database of another shape.
  const std::string impostor = TempPath("impostor");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(impostor.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "PRAGMA application_id=1282102132; PRAGMA user_version=2; "
                         "CREATE TABLE events(x);",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  const absl::Status shape = Ledger::Replay(impostor).status();
  EXPECT_EQ(shape.code(), absl::StatusCode::kDataLoss) << shape;
  EXPECT_THAT(shape.message(), HasSubstr("schema"));
}

// Creating a ledger on a disk that fills up (here: a file-size limit) publishes nothing, and once
// there is room the ledger is created whole.
TEST(LedgerIntegrityTest, CreationOnAFullDiskPublishesNothing) {
  const std::string path = TempPath("full");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead
    const rlimit limit = {8192, 8192};
    setrlimit(RLIMIT_FSIZE, &limit);
    const absl::Status created = Ledger::OpenWriter(path, LedgerOptions::Of(0)).status();
    _exit(created.ok() ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3) << "creation must fail when the file cannot grow";
  EXPECT_FALSE(Exists(path)) << "nothing is published under the ledger's name";
  EXPECT_FALSE(Exists(absl::StrCat(path, "-head")));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Ledger> ledger,
                                Ledger::OpenWriter(path, LedgerOptions::Of(0)));
  LOCKSTEP_ASSERT_OK(RunStep(*ledger, 0));
}

}  // namespace
}  // namespace admission
}  // namespace lockstep
