// The recovery ledger's crash test, in the style of SQLite's own: a writer process runs a few
// steps and is killed (SIGKILL) before its K-th write or fsync — SQLite's writes and syncs of the
// database, its WAL and journal, counted through a VFS that wraps the default one, and the head
// record's (Note [The ledger's head record]) — for every K until a run finishes; then the WAL and
// the database of a finished, killed run are damaged at every frame and every page. After each
// round the ledger must replay to exactly what was committed (a kill loses at most the commit in
// flight) or, for damage only, refuse with kDataLoss; it is never OK with less.
//
// Bounded for CI (kSteps steps, a bit flipped at a few offsets per frame or page); for longer
// runs by hand set LOCKSTEP_LEDGER_CRASH_STEPS (steps per run) and LOCKSTEP_LEDGER_CRASH_OFFSETS
// (offsets per frame or page), e.g.
//   LOCKSTEP_LEDGER_CRASH_STEPS=12 LOCKSTEP_LEDGER_CRASH_OFFSETS=16
//   bazel-bin/admission/ledger_crash_test
// Each test prints its rounds and outcomes.

#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "admission/internal/ledger_head.h"
#include "admission/ledger.h"
#include "base/status_macros.h"
#include "base/status_testutil.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace admission {
namespace {

// ---------------------------------------------------------------------------------------------
// A VFS that counts the writes, truncations and syncs of every file SQLite opens through it and
// kills the process before the one numbered kill_at (0: never).

std::atomic<int64_t> io_count{0};
int64_t kill_at = 0;

void CountAndMaybeDie() {
  if (++io_count == kill_at) raise(SIGKILL);
}

sqlite3_vfs* real_vfs = nullptr;

struct CountedFile {
  sqlite3_file base;  // first: SQLite sees a CountedFile as a sqlite3_file
  sqlite3_file* real;
};

sqlite3_file* Real(sqlite3_file* file) { return reinterpret_cast<CountedFile*>(file)->real; }

int Close(sqlite3_file* f) {
  sqlite3_file* real = Real(f);
  const int rc = real->pMethods != nullptr ? real->pMethods->xClose(real) : SQLITE_OK;
  sqlite3_free(real);
  return rc;
}
int Read(sqlite3_file* f, void* b, int n, sqlite3_int64 o) {
  return Real(f)->pMethods->xRead(Real(f), b, n, o);
}
int Write(sqlite3_file* f, const void* b, int n, sqlite3_int64 o) {
  CountAndMaybeDie();
  return Real(f)->pMethods->xWrite(Real(f), b, n, o);
}
int Truncate(sqlite3_file* f, sqlite3_int64 size) {
  CountAndMaybeDie();
  return Real(f)->pMethods->xTruncate(Real(f), size);
}
int Sync(sqlite3_file* f, int flags) {
  CountAndMaybeDie();
  return Real(f)->pMethods->xSync(Real(f), flags);
}
int FileSize(sqlite3_file* f, sqlite3_int64* s) { return Real(f)->pMethods->xFileSize(Real(f), s); }
int Lock(sqlite3_file* f, int l) { return Real(f)->pMethods->xLock(Real(f), l); }
int Unlock(sqlite3_file* f, int l) { return Real(f)->pMethods->xUnlock(Real(f), l); }
int CheckReservedLock(sqlite3_file* f, int* r) {
  return Real(f)->pMethods->xCheckReservedLock(Real(f), r);
}
int FileControl(sqlite3_file* f, int op, void* arg) {
  return Real(f)->pMethods->xFileControl(Real(f), op, arg);
}
int SectorSize(sqlite3_file* f) { return Real(f)->pMethods->xSectorSize(Real(f)); }
int DeviceCharacteristics(sqlite3_file* f) {
  return Real(f)->pMethods->xDeviceCharacteristics(Real(f));
}
int ShmMap(sqlite3_file* f, int region, int size, int extend, void volatile** p) {
  return Real(f)->pMethods->xShmMap(Real(f), region, size, extend, p);
}
int ShmLock(sqlite3_file* f, int offset, int n, int flags) {
  return Real(f)->pMethods->xShmLock(Real(f), offset, n, flags);
}
void ShmBarrier(sqlite3_file* f) { Real(f)->pMethods->xShmBarrier(Real(f)); }
int ShmUnmap(sqlite3_file* f, int del) { return Real(f)->pMethods->xShmUnmap(Real(f), del); }
int Fetch(sqlite3_file* f, sqlite3_int64 o, int n, void** p) {
  return Real(f)->pMethods->xFetch(Real(f), o, n, p);
}
int Unfetch(sqlite3_file* f, sqlite3_int64 o, void* p) {
  return Real(f)->pMethods->xUnfetch(Real(f), o, p);
}

const sqlite3_io_methods kCountedMethods = {3,
                                            Close,
                                            Read,
                                            Write,
                                            Truncate,
                                            Sync,
                                            FileSize,
                                            Lock,
                                            Unlock,
                                            CheckReservedLock,
                                            FileControl,
                                            SectorSize,
                                            DeviceCharacteristics,
                                            ShmMap,
                                            ShmLock,
                                            ShmBarrier,
                                            ShmUnmap,
                                            Fetch,
                                            Unfetch};

int Open(sqlite3_vfs*, const char* name, sqlite3_file* file, int flags, int* out_flags) {
  auto* counted = reinterpret_cast<CountedFile*>(file);
  counted->base.pMethods = nullptr;
  counted->real = static_cast<sqlite3_file*>(sqlite3_malloc(real_vfs->szOsFile));
  if (counted->real == nullptr) return SQLITE_NOMEM;
  std::memset(counted->real, 0, real_vfs->szOsFile);
  const int rc = real_vfs->xOpen(real_vfs, name, counted->real, flags, out_flags);
  if (rc != SQLITE_OK || counted->real->pMethods == nullptr) {
    sqlite3_free(counted->real);
    return rc != SQLITE_OK ? rc : SQLITE_CANTOPEN;
  }
  counted->base.pMethods = &kCountedMethods;
  return SQLITE_OK;
}

// Installs the counting VFS as SQLite's default (in the writer process only).
void InstallCountingVfs() {
  static sqlite3_vfs counting;
  real_vfs = sqlite3_vfs_find(nullptr);
  counting = *real_vfs;
  counting.zName = "lockstep-counting";
  counting.szOsFile = sizeof(CountedFile);
  counting.xOpen = Open;
  counting.pAppData = nullptr;
  counting.pNext = nullptr;
  sqlite3_vfs_register(&counting, /*makeDflt=*/1);
  internal::SetLedgerHeadIoHookForTesting([](const char*) { CountAndMaybeDie(); });
}

// ---------------------------------------------------------------------------------------------

int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && std::atoi(value) > 0 ? std::atoi(value) : fallback;
}

const int kSteps = EnvInt("LOCKSTEP_LEDGER_CRASH_STEPS", 3);
const int kOffsets = EnvInt("LOCKSTEP_LEDGER_CRASH_OFFSETS", 3);

std::vector<PlannedMicrobatch> Work() {
  return {PlannedMicrobatch::Of("0", {{0, 0, 40}}), PlannedMicrobatch::Of("1", {{0, 40, 100}}),
          PlannedMicrobatch::Of("2", {{1, 0, 30}})};
}

// What a writer process said before it died: the steps whose CommitStep returned OK.
struct WriterRun {
  int64_t acknowledged = -1;  // the last step committed and acknowledged, or -1
  bool finished = false;      // all steps ran (the kill point was not reached)
  int64_t io_points = 0;      // writes and syncs counted in the run
};

// Runs the writer in a child: kSteps steps (each: begin, started and completed per microbatch,
// commit with its fsync), then waits to be killed (so nothing is checkpointed or closed), dying
// earlier at I/O point `die_at` (0: never). Acknowledgements go through a pipe.
WriterRun RunWriter(const std::string& path, int64_t die_at) {
  int ends[2];
  if (pipe(ends) != 0) return {};
  const pid_t child = fork();
  if (child == 0) {
    close(ends[0]);
    InstallCountingVfs();
    kill_at = die_at;
    auto say = [&](const std::string& line) {
      const std::string text = line + "\n";
      if (write(ends[1], text.data(), text.size()) < 0) _exit(2);
    };
    absl::StatusOr<std::unique_ptr<Ledger>> ledger = Ledger::OpenWriter(path, LedgerOptions::Of(0));
    if (!ledger.ok()) {
      say(absl::StrCat("error ", ledger.status().ToString()));
      _exit(1);
    }
    for (int64_t step = 0; step < kSteps; ++step) {
      absl::Status s = (*ledger)->BeginStep(step, Work());
      for (const PlannedMicrobatch& m : Work()) {
        if (!s.ok()) break;
        s = (*ledger)
                ->Record(LedgerEvent::Of(LedgerEventKind::kStarted, step, m.id, m.ranges))
                .status();
        if (s.ok()) {
          s = (*ledger)
                  ->Record(LedgerEvent::Of(LedgerEventKind::kCompleted, step, m.id, m.ranges))
                  .status();
        }
      }
      if (s.ok()) s = (*ledger)->CommitStep(step);
      if (!s.ok()) {
        say(absl::StrCat("error ", s.ToString()));
        _exit(1);
      }
      say(absl::StrCat("committed ", step));
    }
    say(absl::StrCat("finished ", io_count.load()));
    raise(SIGKILL);  // no close: the WAL keeps its frames, as after a crash
  }
  close(ends[1]);
  WriterRun run;
  std::string said;
  char buffer[512];
  ssize_t n;
  while ((n = read(ends[0], buffer, sizeof(buffer))) > 0) said.append(buffer, n);
  close(ends[0]);
  int status = 0;
  waitpid(child, &status, 0);
  std::istringstream lines(said);
  std::string word;
  while (lines >> word) {
    if (word == "committed") {
      lines >> run.acknowledged;
    } else if (word == "finished") {
      run.finished = true;
      lines >> run.io_points;
    } else if (word == "error") {
      std::string rest;
      std::getline(lines, rest);
      ADD_FAILURE() << "the writer failed without being killed (kill point " << die_at
                    << "):" << rest;
    }
  }
  return run;
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

std::string Fresh(const std::string& name) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/crash_", name, "_", getpid());
  RemoveLedgerFiles(path);
  unlink(absl::StrCat(path, "-journal").c_str());
  return path;
}

TEST(LedgerCrashTest, AWriterKilledAtEveryWriteAndSyncLosesNoAcknowledgedCommit) {
  std::map<std::string, int> outcomes;
  int64_t rounds = 0;
  for (int64_t k = 1;; ++k) {
    ++rounds;
    const std::string path = Fresh("kill");
    const WriterRun run = RunWriter(path, k);
    absl::StatusOr<LedgerReplay> replay = Ledger::Replay(path);
    if (!replay.ok()) {
      // Killed while creating: nothing was acknowledged, and no ledger (or none with events).
      ASSERT_EQ(run.acknowledged, -1) << "kill point " << k << ": " << replay.status();
      ASSERT_TRUE(absl::IsNotFound(replay.status()))
          << "kill point " << k << ": a kill is not damage: " << replay.status();
      ++outcomes["no ledger yet"];
    } else {
      const int64_t last = replay->LastCommittedStep(0);
      // Exactly the committed prefix: every acknowledged commit, and at most the one in flight.
      ASSERT_GE(last, run.acknowledged) << "kill point " << k << ": a committed step was lost";
      ASSERT_LE(last, run.acknowledged + 1) << "kill point " << k;
      ++outcomes[last == run.acknowledged ? "replayed to the acknowledged commit"
                                          : "replayed the commit in flight too"];
      // And a writer goes on from there.
      absl::StatusOr<std::unique_ptr<Ledger>> again =
          Ledger::OpenWriter(path, LedgerOptions::Of(0));
      ASSERT_TRUE(again.ok()) << "kill point " << k << ": " << again.status();
    }
    if (run.finished) {
      std::printf(
          "kill rounds: %lld (every write and sync of creation and %d steps, %lld in all)\n",
          static_cast<long long>(rounds), kSteps, static_cast<long long>(run.io_points));
      break;
    }
    ASSERT_LT(k, 100000) << "the run never finished";
  }
  for (const auto& [outcome, count] : outcomes) std::printf("  %s: %d\n", outcome.c_str(), count);
}

// Damage injected into a killed writer's files: every WAL frame (header and page) and every page
// of the database, a bit flipped at a few offsets each, and the WAL cut at every frame boundary.
TEST(LedgerCrashTest, DamageAtEveryFrameAndPageIsRefusedOrHarmlessNeverOkWithLess) {
  const std::string original = Fresh("damage_source");
  const WriterRun run = RunWriter(original, 0);
  ASSERT_TRUE(run.finished);
  const std::string db = ReadFile(original), wal = ReadFile(absl::StrCat(original, "-wal")),
                    head = ReadFile(absl::StrCat(original, "-head"));
  ASSERT_GT(wal.size(), 32u);
  constexpr size_t kPage = 4096, kFrame = 24 + kPage;
  const size_t frames = (wal.size() - 32) / kFrame;
  std::map<std::string, int> outcomes;
  int rounds = 0;
  auto check = [&](const std::string& what, const std::string& db_bytes,
                   const std::string& wal_bytes) {
    ++rounds;
    const std::string path = Fresh("damaged");
    WriteFile(path, db_bytes);
    WriteFile(absl::StrCat(path, "-wal"), wal_bytes);
    WriteFile(absl::StrCat(path, "-head"), head);
    absl::StatusOr<LedgerReplay> replay = Ledger::Replay(path);
    if (replay.ok()) {
      ASSERT_EQ(replay->LastCommittedStep(0), kSteps - 1) << what << ": OK with less";
      ++outcomes["OK with every committed step (the damage missed what is read)"];
    } else {
      ASSERT_TRUE(absl::IsDataLoss(replay.status())) << what << ": " << replay.status();
      ++outcomes["refused as kDataLoss"];
    }
  };
  for (size_t f = 0; f < frames; ++f) {
    const size_t at = 32 + f * kFrame;
    for (int o = 0; o < kOffsets; ++o) {
      std::string damaged = wal;
      // Offsets spread over the frame: its header first, then its page.
      const size_t offset = o == 0 ? 8 : 24 + (kPage - 1) * o / std::max(1, kOffsets - 1);
      damaged[at + std::min(offset, kFrame - 1)] ^= 0x04;
      check(absl::StrCat("WAL frame ", f, " byte ", offset), db, damaged);
    }
    check(absl::StrCat("WAL cut before frame ", f), db, wal.substr(0, at));
  }
  for (size_t p = 0; p < db.size() / kPage; ++p) {
    for (int o = 0; o < kOffsets; ++o) {
      std::string damaged = db;
      damaged[p * kPage + (kPage - 1) * o / std::max(1, kOffsets - 1)] ^= 0x04;
      check(absl::StrCat("database page ", p), damaged, wal);
    }
  }
  std::printf("damage rounds: %d (%zu WAL frames, %zu database pages, %d offsets each)\n", rounds,
              frames, db.size() / kPage, kOffsets);
  for (const auto& [outcome, count] : outcomes) std::printf("  %s: %d\n", outcome.c_str(), count);
}

}  // namespace
}  // namespace admission
}  // namespace lockstep
