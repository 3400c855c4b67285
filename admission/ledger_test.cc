#include "admission/ledger.h"

#include <errno.h>
#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "base/status_testutil.h"
#include "base/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace admission {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/ledger_", name, "_", getpid());
  RemoveLedgerFiles(path);
  return path;
}

// Two sequences (ids 0: 100 tokens, 1: 60 tokens) in three microbatches.
std::vector<PlannedMicrobatch> Work() {
  return {PlannedMicrobatch::Of("0", {{0, 0, 50}}), PlannedMicrobatch::Of("1", {{0, 50, 100}}),
          PlannedMicrobatch::Of("2", {{1, 0, 60}})};
}

LedgerEvent Completed(int64_t step, const PlannedMicrobatch& m) {
  return LedgerEvent::Of(LedgerEventKind::kCompleted, step, m.id, m.ranges, "ok");
}

absl::Status RunStep(Ledger& ledger, int64_t step,
                     Ledger::CommitSync sync = Ledger::CommitSync::kBeforeReturn,
                     absl::string_view commit_detail = "") {
  LOCKSTEP_RETURN_IF_ERROR(ledger.BeginStep(step, Work()));
  for (const PlannedMicrobatch& m : Work()) {
    LOCKSTEP_RETURN_IF_ERROR(
        ledger.Record(LedgerEvent::Of(LedgerEventKind::kStarted, step, m.id, m.ranges)).status());
    LOCKSTEP_RETURN_IF_ERROR(ledger.Record(Completed(step, m)).status());
  }
  return ledger.CommitStep(step, commit_detail, sync);
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

TEST(LedgerTest, RoundTripThroughReplayAndReopen) {
  const std::string path = TempPath("roundtrip");
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto ledger, Ledger::OpenWriter(path, LedgerOptions::Of(3)));
    LOCKSTEP_ASSERT_OK(RunStep(*ledger, 0));
    LOCKSTEP_ASSERT_OK(ledger->BeginStep(1, Work()));
    LOCKSTEP_ASSERT_OK(ledger
                           ->Record(LedgerEvent::Of(LedgerEventKind::kFailed, 1, "0",
                                                    Work()[0].ranges, "out of memory"))
                           .status());
    LOCKSTEP_ASSERT_OK(ledger->Record(Completed(1, Work()[2])).status());
  }
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LedgerReplay replay, Ledger::Replay(path));
  ASSERT_EQ(replay.steps.size(), 2u);
  const StepReplay* done = replay.Find(0, 3);
  ASSERT_NE(done, nullptr);
  EXPECT_TRUE(done->committed);
  EXPECT_EQ(done->planned_tokens, 160);
  EXPECT_EQ(done->completed_tokens, 160);
  EXPECT_EQ(done->completed, (std::vector<TokenRange>{{0, 0, 100}, {1, 0, 60}}));
  EXPECT_TRUE(done->missing.empty());
  EXPECT_EQ(done->event_counts[static_cast<int>(LedgerEventKind::kStarted)], 3);
  const StepReplay* open = replay.Find(1, 3);
  ASSERT_NE(open, nullptr);
  EXPECT_FALSE(open->committed);
  EXPECT_EQ(open->completed_tokens, 60);
  EXPECT_EQ(open->missing, (std::vector<TokenRange>{{0, 0, 100}}));
  EXPECT_EQ(open->completed_microbatches, std::vector<std::string>{"2"});
  EXPECT_EQ(replay.LastCommittedStep(3), 0);
  EXPECT_EQ(replay.Find(0, 0), nullptr);
  EXPECT_THAT(replay.Summary(), HasSubstr("step 1 dp 3: not committed, 60/160 tokens completed"));
  EXPECT_EQ(replay.events.front().kind, LedgerEventKind::kPlanned);
  EXPECT_EQ(replay.events.back().detail, "ok");

  // A new writer continues the open step where the replay says it stands.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto ledger, Ledger::OpenWriter(path, LedgerOptions::Of(3)));
  EXPECT_EQ(ledger->BeginStep(1, Work()).code(), absl::StatusCode::kFailedPrecondition);
  LOCKSTEP_ASSERT_OK(ledger->Record(Completed(1, Work()[0])).status());
  LOCKSTEP_ASSERT_OK(ledger->Record(Completed(1, Work()[1])).status());
  LOCKSTEP_ASSERT_OK(ledger->CommitStep(1, "after restart"));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LedgerReplay again, Ledger::Replay(path));
  EXPECT_EQ(again.LastCommittedStep(3), 1);
  EXPECT_EQ(again.events.size(), replay.events.size() + 3);
}

TEST(LedgerTest, ExactlyOnceIsEnforcedAndARefusedEventWritesNothing) {
  const std::string path = TempPath("once");
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto ledger, Ledger::OpenWriter(path, LedgerOptions::Of(0)));
  LOCKSTEP_ASSERT_OK(ledger->BeginStep(5, Work()));
  LOCKSTEP_ASSERT_OK(ledger->Record(Completed(5, Work()[0])).status());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LedgerReplay before, Ledger::Replay(path));

  // The retried half that overlaps completed work: counted twice.
  absl::StatusOr<int64_t> twice = ledger->Record(
      LedgerEvent::Of(LedgerEventKind::kCompleted, 5, "0.1", {{0, 25, 50}}, "retry"));
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(twice.status().message(), HasSubstr("counted twice"));
  EXPECT_THAT(twice.status().message(), HasSubstr("sequence 0 tokens [25, 50)"));
  // A mixed event whose second range overlaps: its first range must not be written either.
  EXPECT_FALSE(
      ledger
          ->Record(LedgerEvent::Of(LedgerEventKind::kCompleted, 5, "x", {{1, 0, 10}, {0, 40, 60}}))
          .ok());
  absl::StatusOr<int64_t> outside =
      ledger->Record(LedgerEvent::Of(LedgerEventKind::kCompleted, 5, "y", {{1, 50, 70}}));
  EXPECT_THAT(outside.status().message(), HasSubstr("outside the step's plan"));
  EXPECT_FALSE(
      ledger->Record(LedgerEvent::Of(LedgerEventKind::kCompleted, 5, "z", {{7, 0, 1}})).ok());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LedgerReplay after, Ledger::Replay(path));
  EXPECT_EQ(after.events.size(), before.events.size());
  const StepReplay* after_step = after.Find(5, 0);
  const StepReplay* before_step = before.Find(5, 0);
  ASSERT_NE(after_step, nullptr);
  ASSERT_NE(before_step, nullptr);
  EXPECT_EQ(after_step->completed, before_step->completed);

  // Committing with tokens missing names the first missing range.
  absl::Status early = ledger->CommitStep(5);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.message(), HasSubstr("110 planned tokens did not complete"));
  EXPECT_THAT(early.message(), HasSubstr("sequence 0 tokens [50, 100)"));
  EXPECT_EQ(ledger->BeginStep(6, Work()).code(), absl::StatusCode::kFailedPrecondition);

  LOCKSTEP_ASSERT_OK(ledger->Record(Completed(5, Work()[1])).status());
  LOCKSTEP_ASSERT_OK(ledger->Record(Completed(5, Work()[2])).status());
  LOCKSTEP_ASSERT_OK(ledger->CommitStep(5));
  EXPECT_EQ(ledger->CommitStep(5).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ledger->Record(LedgerEvent::Of(LedgerEventKind::kRetried, 5, "0", {})).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ledger->BeginStep(4, Work()).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ledger->Record(LedgerEvent::Of(LedgerEventKind::kStarted, 9, "0", {})).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ledger->Record(LedgerEvent::Of(LedgerEventKind::kPlanned, 5, "0", {})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LedgerTest, MalformedPlansAreRefusedNamingTheProblem) {
  const std::string path = TempPath("malformed");
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto ledger, Ledger::OpenWriter(path, LedgerOptions::Of(0)));
  EXPECT_THAT(ledger->BeginStep(0, {PlannedMicrobatch::Of("a", {{0, 10, 20}})}).message(),
              HasSubstr("do not tile sequence 0: gap at token 0"));
  EXPECT_THAT(ledger
                  ->BeginStep(0, {PlannedMicrobatch::Of("a", {{0, 0, 20}}),
                                  PlannedMicrobatch::Of("b", {{0, 10, 30}})})
                  .message(),
              HasSubstr("overlap at token 10"));
  EXPECT_THAT(ledger
                  ->BeginStep(0, {PlannedMicrobatch::Of("a", {{0, 0, 20}}),
                                  PlannedMicrobatch::Of("a", {{1, 0, 30}})})
                  .message(),
              HasSubstr("id 'a' is empty or repeated"));
  EXPECT_THAT(ledger->BeginStep(0, {PlannedMicrobatch::Of("a", {{0, 5, 5}})}).message(),
              HasSubstr("not a range"));
  EXPECT_EQ(ledger->BeginStep(-1, Work()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger->BeginStep(0, {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Ledger::OpenWriter(TempPath("negative"), LedgerOptions::Of(-2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LedgerReplay replay, Ledger::Replay(path));
  EXPECT_TRUE(replay.events.empty());
}

TEST(LedgerTest, ASecondWriterIsRefused) {
  const std::string path = TempPath("writers");
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto first, Ledger::OpenWriter(path, LedgerOptions::Of(0)));
  absl::StatusOr<std::unique_ptr<Ledger>> second = Ledger::OpenWriter(path, LedgerOptions::Of(0));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("already has a writer"));
  // ... also from another process.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      Child child, Child::Fork(ChildOptions::Reporting(), [&path](int) {
        return Ledger::OpenWriter(path, LedgerOptions::Of(0)).status().code() ==
                       absl::StatusCode::kFailedPrecondition
                   ? 0
                   : 1;
      }));
  child.Reap();
  EXPECT_TRUE(child.succeeded()) << "the other process " << child.Describe();
  // Reading is allowed while the writer works; once it is gone, a new writer may open.
  LOCKSTEP_EXPECT_OK(Ledger::Replay(path).status());
  first.reset();
  LOCKSTEP_EXPECT_OK(Ledger::OpenWriter(path, LedgerOptions::Of(0)).status());
}

// Note [One snapshot of a live ledger]: reads beside a writer that commits all the while each see
// one consistent state, never DATA_LOSS, and never fewer events than the read before.
TEST(LedgerTest, ReadsBesideAnActiveWriterSeeOneSnapshot) {
  const std::string path = TempPath("live");
  { LOCKSTEP_ASSERT_OK(Ledger::OpenWriter(path, LedgerOptions::Of(0)).status()); }
  // The writer commits 200 steps (eight transactions each) while this process reads.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      Child writer, Child::Fork(ChildOptions::Reporting(), [&path](int) {
        absl::StatusOr<std::unique_ptr<Ledger>> ledger =
            Ledger::OpenWriter(path, LedgerOptions::Of(0));
        if (!ledger.ok()) {
          std::fprintf(stderr, "writer: %s\n", ledger.status().ToString().c_str());
          return 1;
        }
        for (int64_t step = 0; step < 200; ++step) {
          if (absl::Status s = RunStep(**ledger, step, Ledger::CommitSync::kInBackground);
              !s.ok()) {
            std::fprintf(stderr, "writer at step %lld: %s\n", static_cast<long long>(step),
                         s.ToString().c_str());
            return 2;
          }
        }
        return 0;
      }));
  size_t seen = 0;
  int reads = 0, growing = 0;
  for (; !writer.TryReap() && reads < 2000; ++reads) {
    absl::StatusOr<LedgerReplay> replay = Ledger::Replay(path);
    ASSERT_TRUE(replay.ok()) << "read " << reads << " beside the writer: " << replay.status();
    EXPECT_GE(replay->events.size(), seen);
    growing += replay->events.size() > seen;
    seen = replay->events.size();
  }
  writer.Reap();
  EXPECT_TRUE(writer.succeeded()) << "the writer " << writer.Describe();
  EXPECT_GE(growing, 5) << "the writer was not committing while " << reads << " reads ran";
}

TEST(LedgerTest, FilesThatAreNotIntactLedgersAreRefused) {
  EXPECT_EQ(Ledger::Replay(TempPath("absent")).status().code(), absl::StatusCode::kNotFound);

  const std::string empty = TempPath("empty");
  WriteFile(empty, "");
  EXPECT_EQ(Ledger::Replay(empty).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Ledger::OpenWriter(empty, LedgerOptions::Of(0)).status().code(),
            absl::StatusCode::kDataLoss);

  const std::string garbage = TempPath("garbage");
  WriteFile(garbage, std::string(8192, 'x'));
  EXPECT_EQ(Ledger::Replay(garbage).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadFile(garbage), std::string(8192, 'x')) << "a refused file must be left as it is";

  const std::string other = TempPath("other");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(other.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(
      sqlite3_exec(db, "CREATE TABLE t(x); INSERT INTO t VALUES (1);", nullptr, nullptr, nullptr),
      SQLITE_OK);
  sqlite3_close(db);
  absl::StatusOr<LedgerReplay> replay = Ledger::Replay(other);
  EXPECT_EQ(replay.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(replay.status().message(), HasSubstr("is not a ledger's"));
}

// A ledger of a few steps, closed (so its WAL is checkpointed into the file); returns its path.
absl::StatusOr<std::string> SmallLedger(const std::string& name) {
  const std::string path = TempPath(name);
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Ledger> ledger,
                            Ledger::OpenWriter(path, LedgerOptions::Of(1)));
  for (int step = 0; step < 4; ++step) LOCKSTEP_RETURN_IF_ERROR(RunStep(*ledger, step));
  LOCKSTEP_RETURN_IF_ERROR(ledger->BeginStep(4, Work()));
  LOCKSTEP_RETURN_IF_ERROR(
      ledger
          ->Record(LedgerEvent::Of(LedgerEventKind::kFailed, 4, "1", {{0, 50, 100}}, "MARKER-OOM"))
          .status());
  return path;
}

bool SameReplay(const LedgerReplay& a, const LedgerReplay& b) {
  if (a.events.size() != b.events.size() || a.Summary() != b.Summary()) return false;
  for (size_t i = 0; i < a.events.size(); ++i) {
    const LedgerEvent &x = a.events[i], &y = b.events[i];
    if (x.kind != y.kind || x.step != y.step || x.dp_rank != y.dp_rank ||
        x.microbatch != y.microbatch || !(x.ranges == y.ranges) || x.detail != y.detail) {
      return false;
    }
  }
  return true;
}

TEST(LedgerTest, TruncationAndByteFlipsAreDetectedNeverSilentlyUsed) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const std::string path, SmallLedger("flips"));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LedgerReplay original, Ledger::Replay(path));
  const std::string bytes = ReadFile(path);
  ASSERT_GT(bytes.size(), 4096u);
  const std::string copy = TempPath("flips_copy");

  // Truncation at page boundaries and inside pages.
  for (size_t keep : {size_t{0} + 100, size_t{4096}, bytes.size() - 4096, bytes.size() - 1}) {
    WriteFile(copy, bytes.substr(0, keep));
    absl::StatusOr<LedgerReplay> replay = Ledger::Replay(copy);
    EXPECT_FALSE(replay.ok() && SameReplay(*replay, original)) << "kept " << keep;
    EXPECT_FALSE(replay.ok()) << "truncated to " << keep << " bytes was accepted";
  }

  // The flip of a byte inside an event's text is found by the chain.
  const size_t marker = bytes.find("MARKER-OOM");
  ASSERT_NE(marker, std::string::npos);
  std::string edited = bytes;
  edited[marker + 7] = 'X';
  WriteFile(copy, edited);
  absl::StatusOr<LedgerReplay> replay = Ledger::Replay(copy);
  EXPECT_EQ(replay.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(replay.status().message(), HasSubstr("does not match its chain"));

  // Any single byte flipped: refused, or (a byte SQLite does not use) the same contents.
  std::mt19937_64 random(17);
  int detected = 0, harmless = 0;
  for (int trial = 0; trial < 600; ++trial) {
    std::string flipped = bytes;
    const size_t at = random() % bytes.size();
    flipped[at] = static_cast<char>(flipped[at] ^ (1 << (random() % 8)));
    WriteFile(copy, flipped);
    absl::StatusOr<LedgerReplay> result = Ledger::Replay(copy);
    if (!result.ok()) {
      ++detected;
    } else {
      ASSERT_TRUE(SameReplay(*result, original)) << "a flip at byte " << at << " changed the "
                                                 << "ledger's contents without being detected";
      ++harmless;
    }
  }
  EXPECT_GT(detected, 0);
  std::printf("byte flips: %d detected, %d harmless (unused bytes)\n", detected, harmless);
}

TEST(LedgerTest, EditsBehindTheTriggersAreDetected) {
  // Negative control for the replay checks: a user who drops the append-only triggers and edits
  // rows gets a ledger that Replay refuses.
  struct Edit {
    const char* sql;
    const char* expected;
  };
  const std::vector<Edit> edits = {
      // Triggers dropped: the schema is not this build's.
      {"DROP TRIGGER events_no_update; UPDATE events SET detail = 'x' WHERE seq = 3;",
       "schema lacks trigger events_no_update"},
      {"DROP TRIGGER contribution_counted_once;", "schema lacks trigger contribution_counted_once"},
      {"CREATE INDEX extra ON events(step);", "has index extra, which a ledger does not"},
      // Dropped, used, and put back word for word: the chain still tells.
      {"DROP TRIGGER events_no_update; UPDATE events SET detail = 'x' WHERE seq = 3; "
       "CREATE TRIGGER events_no_update BEFORE UPDATE ON events\n"
       "BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;",
       "does not match its chain"},
      {"DROP TRIGGER events_no_delete; DELETE FROM events WHERE seq = 2; "
       "CREATE TRIGGER events_no_delete BEFORE DELETE ON events\n"
       "BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;",
       "is missing"},
      {"DELETE FROM contributions WHERE step = 1;", "contributions disagrees"},
      {"DELETE FROM commits WHERE step = 2;", "commits disagrees"},
      {"UPDATE planned SET num_tokens = 99 WHERE step = 0 AND batch_index = 0;",
       "planned disagrees"},
  };
  for (const Edit& edit : edits) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const std::string path, SmallLedger("edited"));
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, edit.sql, nullptr, nullptr, nullptr), SQLITE_OK)
        << sqlite3_errmsg(db);
    sqlite3_close(db);
    absl::StatusOr<LedgerReplay> replay = Ledger::Replay(path);
    EXPECT_EQ(replay.status().code(), absl::StatusCode::kDataLoss) << edit.sql;
    EXPECT_THAT(replay.status().message(), HasSubstr(edit.expected)) << edit.sql;
  }
}

TEST(LedgerTest, ABackgroundCommitIsWrittenOnReturnAndAwaitedByTheNextCall) {
  const std::string path = TempPath("background");
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Ledger> ledger,
                                Ledger::OpenWriter(path, LedgerOptions::Of(0)));
  for (int64_t step = 0; step < 3; ++step) {
    LOCKSTEP_ASSERT_OK(RunStep(*ledger, step, Ledger::CommitSync::kInBackground));
    // Written before CommitStep returned: another connection sees the commit.
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(LedgerReplay replay, Ledger::Replay(path));
    EXPECT_EQ(replay.LastCommittedStep(0), step);
  }
  LOCKSTEP_EXPECT_OK(ledger->AwaitDurable());
  LOCKSTEP_EXPECT_OK(ledger->AwaitDurable());  // nothing pending: returns at once
}

TEST(LedgerTest, AFailedBackgroundFsyncIsEveryLaterCallsError) {
  const std::string path = TempPath("background_fails");
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Ledger> ledger,
                                Ledger::OpenWriter(path, LedgerOptions::Of(0)));
  LOCKSTEP_ASSERT_OK(RunStep(*ledger, 0, Ledger::CommitSync::kInBackground));
  LOCKSTEP_ASSERT_OK(ledger->AwaitDurable());
  // The WAL's name gone (SQLite keeps writing through its open descriptor): the background
  // thread cannot open it to fsync it.
  const std::string wal = absl::StrCat(path, "-wal");
  ASSERT_EQ(unlink(wal.c_str()), 0) << strerror(errno);
  // The commit itself is written.
  LOCKSTEP_ASSERT_OK(RunStep(*ledger, 1, Ledger::CommitSync::kInBackground));
  const absl::Status durable = ledger->AwaitDurable();
  EXPECT_EQ(durable.code(), absl::StatusCode::kInternal) << durable;
  EXPECT_THAT(durable.message(), HasSubstr(wal));
  EXPECT_THAT(durable.message(), HasSubstr("in the background"));
  EXPECT_EQ(ledger->BeginStep(2, Work()), durable) << "sticky: the next step may not begin";
  EXPECT_EQ(ledger->AwaitDurable(), durable);
}

absl::Status QueueStep(Ledger& ledger, int64_t step) {
  LOCKSTEP_RETURN_IF_ERROR(ledger.QueueBeginStep(step, Work()));
  for (const PlannedMicrobatch& m : Work()) {
    LOCKSTEP_RETURN_IF_ERROR(
        ledger.QueueRecord(LedgerEvent::Of(LedgerEventKind::kStarted, step, m.id, m.ranges)));
    LOCKSTEP_RETURN_IF_ERROR(ledger.QueueRecord(Completed(step, m)));
  }
  return ledger.QueueCommitStep(step, "queued");
}

TEST(LedgerTest, QueuedWritesAreWrittenInCallOrderAsTheirDirectForms) {
  const std::string path = TempPath("queued");
  const std::string direct_path = TempPath("queued_direct");
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Ledger> ledger,
                                Ledger::OpenWriter(path, LedgerOptions::Of(0)));
  for (int64_t step = 0; step < 3; ++step) LOCKSTEP_ASSERT_OK(QueueStep(*ledger, step));
  EXPECT_EQ(ledger->last_begun_step(), 2);
  LOCKSTEP_ASSERT_OK(ledger->AwaitDurable());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LedgerReplay queued, Ledger::Replay(path));
  // The same calls made directly write the same events.
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Ledger> direct,
                                  Ledger::OpenWriter(direct_path, LedgerOptions::Of(0)));
    for (int64_t step = 0; step < 3; ++step) {
      LOCKSTEP_ASSERT_OK(RunStep(*direct, step, Ledger::CommitSync::kBeforeReturn, "queued"));
    }
  }
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LedgerReplay direct, Ledger::Replay(direct_path));
  ASSERT_EQ(queued.events.size(), direct.events.size());
  ASSERT_EQ(queued.events.size(), 3u * (3 + 6 + 1));
  for (size_t i = 0; i < queued.events.size(); ++i) {
    const LedgerEvent& q = queued.events[i];
    const LedgerEvent& d = direct.events[i];
    EXPECT_EQ(q.seq, d.seq);
    EXPECT_EQ(q.kind, d.kind) << "event " << i;
    EXPECT_EQ(q.step, d.step) << "event " << i;
    EXPECT_EQ(q.microbatch, d.microbatch) << "event " << i;
    EXPECT_EQ(q.ranges, d.ranges) << "event " << i;
    EXPECT_EQ(q.detail, d.detail) << "event " << i;
  }
  EXPECT_EQ(queued.LastCommittedStep(0), 2);
  // A direct call after queued ones waits for them: the next step begins after step 2.
  LOCKSTEP_EXPECT_OK(RunStep(*ledger, 3));
  // And the ledger's account survives reopening.
  ledger.reset();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(ledger, Ledger::OpenWriter(path, LedgerOptions::Of(0)));
  EXPECT_EQ(ledger->last_begun_step(), 3);
}

TEST(LedgerTest, QueuedCallsAreRefusedAtOnceWhenTheirStepCannotTakeThem) {
  const std::string path = TempPath("queued_refusals");
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Ledger> ledger,
                                Ledger::OpenWriter(path, LedgerOptions::Of(0)));
  LOCKSTEP_ASSERT_OK(QueueStep(*ledger, 0));
  LOCKSTEP_ASSERT_OK(ledger->QueueBeginStep(1, Work()));
  const absl::Status open = ledger->QueueBeginStep(2, Work());
  EXPECT_EQ(open.code(), absl::StatusCode::kFailedPrecondition) << open;
  EXPECT_THAT(open.message(), HasSubstr("step 1 began and has not committed"));
  const absl::Status again = ledger->QueueBeginStep(1, Work());
  EXPECT_THAT(again.message(), HasSubstr("already begun"));
  const absl::Status old = ledger->QueueRecord(Completed(0, Work()[0]));
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition) << old;
  EXPECT_THAT(old.message(), HasSubstr("not the open one (step 1)"));
  const absl::Status kind =
      ledger->QueueRecord(LedgerEvent::Of(LedgerEventKind::kPlanned, 1, "0", {{0, 0, 50}}));
  EXPECT_EQ(kind.code(), absl::StatusCode::kInvalidArgument) << kind;
  const absl::Status early = ledger->QueueCommitStep(0);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition) << early;
  LOCKSTEP_ASSERT_OK(ledger->AwaitDurable());
  // None of the refused calls was written; the open step stays open.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LedgerReplay replay, Ledger::Replay(path));
  ASSERT_EQ(replay.steps.size(), 2u);
  EXPECT_TRUE(replay.steps[0].committed);
  EXPECT_FALSE(replay.steps[1].committed);
  EXPECT_EQ(replay.steps[1].completed_tokens, 0);
  EXPECT_EQ(replay.events.size(), 10u + 3u);
  // A malformed plan is refused as BeginStep refuses it.
  LOCKSTEP_ASSERT_OK(ledger->QueueRecord(Completed(1, Work()[0])));
  LOCKSTEP_ASSERT_OK(ledger->QueueRecord(Completed(1, Work()[1])));
  LOCKSTEP_ASSERT_OK(ledger->QueueRecord(Completed(1, Work()[2])));
  LOCKSTEP_ASSERT_OK(ledger->QueueCommitStep(1));
  const absl::Status gap = ledger->QueueBeginStep(2, {PlannedMicrobatch::Of("0", {{0, 10, 50}})});
  EXPECT_EQ(gap.code(), absl::StatusCode::kInvalidArgument) << gap;
  EXPECT_THAT(gap.message(), HasSubstr("gap at token 0"));
  LOCKSTEP_EXPECT_OK(ledger->AwaitDurable());
}

TEST(LedgerTest, AQueuedWriteRefusedWhenWrittenStopsEveryLaterWrite) {
  const std::string path = TempPath("queued_fails");
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Ledger> ledger,
                                Ledger::OpenWriter(path, LedgerOptions::Of(0)));
  LOCKSTEP_ASSERT_OK(ledger->QueueBeginStep(0, Work()));
  LOCKSTEP_ASSERT_OK(ledger->QueueRecord(Completed(0, Work()[0])));
  // Counted twice: only the trigger, when it is written, can tell.
  LOCKSTEP_ASSERT_OK(ledger->QueueRecord(Completed(0, Work()[0])));
  // Queued behind the refused write (or refused at once once the writer has failed): never
  // written either way. Several, so that some are queued before the writer reaches the refusal.
  for (int i = 0; i < 50; ++i) {
    ledger->QueueRecord(LedgerEvent::Of(LedgerEventKind::kStarted, 0, "1", Work()[1].ranges))
        .IgnoreError();
  }
  ledger->QueueRecord(Completed(0, Work()[1])).IgnoreError();
  const absl::Status failed = ledger->AwaitDurable();
  EXPECT_EQ(failed.code(), absl::StatusCode::kFailedPrecondition) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("counted twice"));
  EXPECT_THAT(failed.message(), HasSubstr("completed 0"));
  // Sticky: every later call, queued or direct, returns it, also one the ledger's account would
  // refuse for another reason (step 0 is still open there).
  EXPECT_EQ(ledger->QueueRecord(Completed(0, Work()[2])), failed);
  EXPECT_EQ(ledger->QueueBeginStep(1, Work()), failed);
  EXPECT_EQ(ledger->QueueCommitStep(0), failed);
  EXPECT_EQ(ledger->Record(Completed(0, Work()[2])).status(), failed);
  EXPECT_EQ(ledger->CommitStep(0), failed);
  ledger.reset();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LedgerReplay replay, Ledger::Replay(path));
  ASSERT_EQ(replay.steps.size(), 1u);
  EXPECT_EQ(replay.steps[0].completed_microbatches, std::vector<std::string>{"0"});
  EXPECT_EQ(replay.events.size(), 3u + 1u);
}

TEST(LedgerTest, DestroyingTheLedgerWritesWhatWasQueued) {
  const std::string path = TempPath("queued_destroyed");
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Ledger> ledger,
                                  Ledger::OpenWriter(path, LedgerOptions::Of(0)));
    for (int64_t step = 0; step < 2; ++step) LOCKSTEP_ASSERT_OK(QueueStep(*ledger, step));
  }
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LedgerReplay replay, Ledger::Replay(path));
  EXPECT_EQ(replay.LastCommittedStep(0), 1);
  EXPECT_EQ(replay.events.size(), 20u);
}

// The body of a writer killed at a random point: commits step after step at `path`,
// acknowledging each commit on `channel` only after CommitStep returned. Returns only on an error
// (3: open, 4: a step, 5: the acknowledgement).
// With `queued`, the steps' writes are queued and a step is acknowledged once AwaitDurable
// returned.
int CommitUntilKilled(const std::string& path, bool fsync_at_commit, Ledger::CommitSync sync,
                      bool queued, int channel) {
  LedgerOptions options = LedgerOptions::Of(0);
  options.fsync_at_commit = fsync_at_commit;
  auto ledger = Ledger::OpenWriter(path, options);
  if (!ledger.ok()) return 3;
  for (int64_t step = 0;; ++step) {
    absl::Status ran = queued ? QueueStep(**ledger, step) : RunStep(**ledger, step, sync);
    if (queued && ran.ok()) ran = (*ledger)->AwaitDurable();
    if (!ran.ok()) return 4;
    if (write(channel, &step, sizeof(step)) != sizeof(step)) return 5;
  }
}

TEST(LedgerTest, SigkillAtRandomPointsLosesNoCommittedStep) {
  std::mt19937_64 random(2026);
  for (int round = 0; round < 24; ++round) {
    const std::string path = TempPath(absl::StrCat("kill", round));
    // In turn: fsync before CommitStep returns, no fsync, fsync in the background (a commit
    // acknowledged before its fsync must survive the kill as well), every write queued (killed
    // with writes queued, the file must hold an intact prefix of them).
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(
        Child child, Child::Fork(ChildOptions::Reporting(), [&](int channel) {
          return CommitUntilKilled(path, /*fsync_at_commit=*/round % 4 != 1,
                                   round % 4 == 2 ? Ledger::CommitSync::kInBackground
                                                  : Ledger::CommitSync::kBeforeReturn,
                                   /*queued=*/round % 4 == 3, channel);
        }));
    usleep(static_cast<useconds_t>(2000 + random() % 60000));
    child.Signal(SIGKILL);
    child.Reap();
    ASSERT_THAT(child.Describe(), ::testing::StartsWith("was killed by signal"))
        << "the writer stopped by itself";
    // Every acknowledgement written before the kill (the channel ends with the writer).
    std::string acknowledgements;
    for (;;) {
      LOCKSTEP_ASSERT_OK_AND_ASSIGN(
          const int open,
          PollChannels({&child}, absl::Seconds(20), [&](size_t, absl::string_view bytes) {
            acknowledgements.append(bytes.data(), bytes.size());
          }));
      if (open == 0) break;
    }
    int64_t acknowledged = -1;
    for (size_t at = 0; at + sizeof(acknowledged) <= acknowledgements.size();
         at += sizeof(acknowledged)) {
      std::memcpy(&acknowledged, acknowledgements.data() + at, sizeof(acknowledged));
    }

    absl::StatusOr<LedgerReplay> replay = Ledger::Replay(path);
    if (!replay.ok() && absl::IsNotFound(replay.status())) {
      EXPECT_EQ(acknowledged, -1) << "killed before the ledger existed, yet a step committed";
      continue;
    }
    ASSERT_TRUE(replay.ok()) << "round " << round << ": " << replay.status();
    const int64_t last = replay->LastCommittedStep(0);
    EXPECT_GE(last, acknowledged) << "a committed step was lost";
    for (const StepReplay& step : replay->steps) {
      if (step.step <= last) {
        EXPECT_TRUE(step.committed) << "round " << round << ", step " << step.step;
        EXPECT_EQ(step.completed_tokens, 160);
      } else {
        EXPECT_EQ(step.step, last + 1);
        EXPECT_FALSE(step.committed);
        EXPECT_EQ(
            step.completed_tokens +
                [&] {
                  int64_t missing = 0;
                  for (const TokenRange& r : step.missing) missing += r.end - r.begin;
                  return missing;
                }(),
            160);
      }
    }
    // The run continues: a new writer completes the open step's missing work and commits.
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto ledger, Ledger::OpenWriter(path, LedgerOptions::Of(0)));
    const StepReplay* open = replay->Find(last + 1, 0);
    if (open != nullptr) {
      for (const TokenRange& r : open->missing) {
        LOCKSTEP_ASSERT_OK(
            ledger->Record(LedgerEvent::Of(LedgerEventKind::kCompleted, last + 1, "resumed", {r}))
                .status());
      }
      LOCKSTEP_ASSERT_OK(ledger->CommitStep(last + 1));
    }
  }
}

}  // namespace
}  // namespace admission
}  // namespace lockstep
