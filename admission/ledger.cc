#include "admission/ledger.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <system_error>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "admission/internal/sqlite.h"
#include "base/logging.h"
#include "base/sha256.h"
#include "base/status_macros.h"

namespace lockstep {
namespace admission {
namespace {

using internal::SqliteDb;
using internal::SqliteStatement;

// "LkSt" in the database header, so that another SQLite file is not mistaken for a ledger.
constexpr int64_t kApplicationId = 0x4C6B5374;
constexpr int64_t kSchemaVersion = 1;
constexpr absl::string_view kChainTag = "lockstep/admission/ledger-event/v1";
constexpr int kNumKinds = 8;

constexpr absl::string_view kSchema = R"sql(
CREATE TABLE events(
  seq INTEGER PRIMARY KEY,
  step INTEGER NOT NULL CHECK (step >= 0),
  dp_rank INTEGER NOT NULL CHECK (dp_rank >= 0),
  kind TEXT NOT NULL CHECK (kind IN ('planned', 'admitted', 'started', 'completed', 'failed',
                                     'split', 'retried', 'step_committed')),
  microbatch TEXT NOT NULL,
  ranges TEXT NOT NULL,
  detail TEXT NOT NULL,
  chain BLOB NOT NULL CHECK (length(chain) = 32));
CREATE TABLE planned(
  step INTEGER NOT NULL, dp_rank INTEGER NOT NULL, batch_index INTEGER NOT NULL,
  num_tokens INTEGER NOT NULL CHECK (num_tokens > 0),
  PRIMARY KEY (step, dp_rank, batch_index)) WITHOUT ROWID;
CREATE TABLE contributions(
  step INTEGER NOT NULL, dp_rank INTEGER NOT NULL, batch_index INTEGER NOT NULL,
  token_begin INTEGER NOT NULL CHECK (token_begin >= 0),
  token_end INTEGER NOT NULL,
  event_seq INTEGER NOT NULL REFERENCES events(seq),
  CHECK (token_end > token_begin),
  PRIMARY KEY (step, dp_rank, batch_index, token_begin)) WITHOUT ROWID;
CREATE TABLE commits(
  step INTEGER NOT NULL, dp_rank INTEGER NOT NULL,
  event_seq INTEGER NOT NULL REFERENCES events(seq),
  PRIMARY KEY (step, dp_rank)) WITHOUT ROWID;
CREATE TRIGGER contribution_counted_once BEFORE INSERT ON contributions
WHEN EXISTS (SELECT 1 FROM contributions c
             WHERE c.step = NEW.step AND c.dp_rank = NEW.dp_rank
               AND c.batch_index = NEW.batch_index
               AND c.token_begin < NEW.token_end AND NEW.token_begin < c.token_end)
BEGIN SELECT RAISE(ABORT, 'exactly-once: token range counted twice'); END;
CREATE TRIGGER contribution_planned BEFORE INSERT ON contributions
WHEN NOT EXISTS (SELECT 1 FROM planned p
                 WHERE p.step = NEW.step AND p.dp_rank = NEW.dp_rank
                   AND p.batch_index = NEW.batch_index AND NEW.token_end <= p.num_tokens)
BEGIN SELECT RAISE(ABORT, 'exactly-once: token range outside the step''s plan'); END;
CREATE TRIGGER contribution_step_open BEFORE INSERT ON contributions
WHEN EXISTS (SELECT 1 FROM commits m WHERE m.step = NEW.step AND m.dp_rank = NEW.dp_rank)
BEGIN SELECT RAISE(ABORT, 'exactly-once: the step already committed'); END;
CREATE TRIGGER commit_complete BEFORE INSERT ON commits
WHEN (SELECT COALESCE(SUM(num_tokens), 0) FROM planned p
      WHERE p.step = NEW.step AND p.dp_rank = NEW.dp_rank) !=
     (SELECT COALESCE(SUM(token_end - token_begin), 0) FROM contributions c
      WHERE c.step = NEW.step AND c.dp_rank = NEW.dp_rank)
BEGIN SELECT RAISE(ABORT, 'exactly-once: the step has tokens that did not complete'); END;
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
)sql";

constexpr absl::string_view kKindNames[kNumKinds] = {
    "planned", "admitted", "started", "completed", "failed", "split", "retried", "step_committed"};

bool ParseKind(absl::string_view name, LedgerEventKind* kind) {
  for (int k = 0; k < kNumKinds; ++k) {
    if (kKindNames[k] == name) {
      *kind = static_cast<LedgerEventKind>(k);
      return true;
    }
  }
  return false;
}

bool ParseRanges(absl::string_view text, std::vector<TokenRange>* ranges) {
  ranges->clear();
  if (text.empty()) return true;
  for (absl::string_view part : absl::StrSplit(text, ';')) {
    std::vector<absl::string_view> index_rest = absl::StrSplit(part, absl::MaxSplits(':', 1));
    if (index_rest.size() != 2) return false;
    std::vector<absl::string_view> bounds = absl::StrSplit(index_rest[1], absl::MaxSplits('-', 1));
    TokenRange range;
    if (bounds.size() != 2 || !absl::SimpleAtoi(index_rest[0], &range.batch_index) ||
        !absl::SimpleAtoi(bounds[0], &range.begin) || !absl::SimpleAtoi(bounds[1], &range.end) ||
        range.batch_index < 0 || range.begin < 0 || range.end <= range.begin) {
      return false;
    }
    ranges->push_back(range);
  }
  return true;
}

std::string RangeText(const TokenRange& r) {
  return absl::StrCat("sequence ", r.batch_index, " tokens [", r.begin, ", ", r.end, ")");
}

std::string ChainOf(absl::string_view previous, const LedgerEvent& e, absl::string_view ranges) {
  const std::string seq = absl::StrCat(e.seq), step = absl::StrCat(e.step),
                    rank = absl::StrCat(e.dp_rank);
  const Sha256Digest digest =
      Sha256Framed({kChainTag, previous, seq, step, rank, LedgerEventKindName(e.kind), e.microbatch,
                    ranges, e.detail});
  return std::string(reinterpret_cast<const char*>(digest.data()), digest.size());
}

absl::Status Corrupt(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("ledger ", path, " is not intact: ", what));
}

using StepKey = std::pair<int64_t, int>;  // (step, dp_rank)

// Sorted, merged copy of `ranges`.
std::vector<TokenRange> Merged(std::vector<TokenRange> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const TokenRange& a, const TokenRange& b) {
    return std::tie(a.batch_index, a.begin) < std::tie(b.batch_index, b.begin);
  });
  std::vector<TokenRange> merged;
  for (const TokenRange& r : ranges) {
    if (!merged.empty() && merged.back().batch_index == r.batch_index &&
        merged.back().end == r.begin) {
      merged.back().end = r.end;
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

// Planned ranges (one per sequence: [0, num_tokens)) minus the completed (merged, disjoint).
std::vector<TokenRange> Missing(const std::map<int32_t, int64_t>& planned,
                                const std::vector<TokenRange>& completed) {
  std::vector<TokenRange> missing;
  auto c = completed.begin();
  for (const auto& [index, tokens] : planned) {
    int64_t at = 0;
    while (c != completed.end() && c->batch_index < index) ++c;
    for (; c != completed.end() && c->batch_index == index; ++c) {
      if (c->begin > at) missing.push_back({index, at, c->begin});
      at = std::max(at, c->end);
    }
    if (at < tokens) missing.push_back({index, at, tokens});
  }
  return missing;
}

struct Verified {
  LedgerReplay replay;
  std::string chain;
  int64_t next_seq = 1;
};

// Reads every table of `db`, checks the ledger's invariants and builds its replay.
absl::StatusOr<Verified> LoadAndVerify(SqliteDb& db) {
  const std::string& path = db.path();
  LOCKSTEP_ASSIGN_OR_RETURN(int64_t application_id, db.QueryInt("PRAGMA application_id"));
  LOCKSTEP_ASSIGN_OR_RETURN(int64_t version, db.QueryInt("PRAGMA user_version"));
  if (application_id != kApplicationId) {
    return Corrupt(path, absl::StrCat("application id ", application_id, " is not a ledger's (",
                                      kApplicationId, "); an empty file never finished creation"));
  }
  if (version != kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat("ledger ", path, " has schema version ",
                                                      version, "; this build reads version ",
                                                      kSchemaVersion));
  }
  {
    LOCKSTEP_ASSIGN_OR_RETURN(SqliteStatement check, db.Prepare("PRAGMA integrity_check(4)"));
    std::vector<std::string> problems;
    while (true) {
      LOCKSTEP_ASSIGN_OR_RETURN(bool row, check.Step());
      if (!row) break;
      problems.push_back(check.ColumnText(0));
    }
    if (problems.size() != 1 || problems[0] != "ok") {
      return Corrupt(path, absl::StrCat("integrity_check: ", absl::StrJoin(problems, "; ")));
    }
  }

  Verified verified;
  std::map<StepKey, std::map<int32_t, int64_t>> planned;
  std::map<StepKey, std::vector<TokenRange>> completed;
  std::map<StepKey, int64_t> commits;
  std::map<StepKey, size_t> step_index;
  std::set<std::tuple<int64_t, int, int32_t, int64_t, int64_t, int64_t>> contributions;
  {
    LOCKSTEP_ASSIGN_OR_RETURN(
        SqliteStatement rows,
        db.Prepare("SELECT seq, step, dp_rank, kind, microbatch, ranges, detail, chain "
                   "FROM events ORDER BY seq"));
    while (true) {
      LOCKSTEP_ASSIGN_OR_RETURN(bool row, rows.Step());
      if (!row) break;
      LedgerEvent e;
      e.seq = rows.ColumnInt(0);
      e.step = rows.ColumnInt(1);
      e.dp_rank = static_cast<int>(rows.ColumnInt(2));
      const std::string kind = rows.ColumnText(3), ranges = rows.ColumnText(5);
      e.microbatch = rows.ColumnText(4);
      e.detail = rows.ColumnText(6);
      const std::string where = absl::StrCat("event ", e.seq);
      if (e.seq != verified.next_seq) {
        return Corrupt(
            path, absl::StrCat("event ", verified.next_seq, " is missing (next is ", e.seq, ")"));
      }
      if (!ParseKind(kind, &e.kind)) return Corrupt(path, absl::StrCat(where, ": kind ", kind));
      if (!ParseRanges(ranges, &e.ranges)) {
        return Corrupt(path, absl::StrCat(where, ": ranges '", ranges, "'"));
      }
      const std::string chain = ChainOf(verified.chain, e, ranges);
      if (rows.ColumnBlob(7) != chain) {
        return Corrupt(path, absl::StrCat(where, " (step ", e.step, ", ", kind, " ", e.microbatch,
                                          ") does not match its chain: edited or damaged"));
      }
      verified.chain = chain;
      ++verified.next_seq;

      const StepKey key{e.step, e.dp_rank};
      auto [it, inserted] = step_index.emplace(key, verified.replay.steps.size());
      if (inserted) {
        if (e.kind != LedgerEventKind::kPlanned) {
          return Corrupt(path, absl::StrCat(where, ": step ", e.step, " has ", kind,
                                            " before it was planned"));
        }
        StepReplay step;
        step.step = e.step;
        step.dp_rank = e.dp_rank;
        step.event_counts.assign(kNumKinds, 0);
        verified.replay.steps.push_back(std::move(step));
      }
      StepReplay& step = verified.replay.steps[it->second];
      if (step.committed) {
        return Corrupt(path, absl::StrCat(where, ": ", kind, " after step ", e.step, " committed"));
      }
      ++step.event_counts[static_cast<int>(e.kind)];
      switch (e.kind) {
        case LedgerEventKind::kPlanned:
          for (const TokenRange& r : e.ranges) {
            int64_t& tokens = planned[key][r.batch_index];
            tokens = std::max(tokens, r.end);
          }
          break;
        case LedgerEventKind::kCompleted:
          for (const TokenRange& r : e.ranges) {
            for (const TokenRange& c : completed[key]) {
              if (c.batch_index == r.batch_index && c.begin < r.end && r.begin < c.end) {
                return Corrupt(
                    path, absl::StrCat("exactly-once violated: ", RangeText(r), " of step ", e.step,
                                       " counted twice (", where, ")"));
              }
            }
            auto p = planned[key].find(r.batch_index);
            if (p == planned[key].end() || r.end > p->second) {
              return Corrupt(path, absl::StrCat(where, ": ", RangeText(r), " is not planned"));
            }
            completed[key].push_back(r);
            contributions.emplace(e.step, e.dp_rank, r.batch_index, r.begin, r.end, e.seq);
            step.completed_tokens += r.end - r.begin;
          }
          step.completed_microbatches.push_back(e.microbatch);
          break;
        case LedgerEventKind::kStepCommitted:
          step.committed = true;
          commits[key] = e.seq;
          break;
        default:
          break;
      }
      verified.replay.events.push_back(std::move(e));
    }
  }

  for (StepReplay& step : verified.replay.steps) {
    const StepKey key{step.step, step.dp_rank};
    for (const auto& [index, tokens] : planned[key]) step.planned_tokens += tokens;
    step.completed = Merged(completed[key]);
    step.missing = Missing(planned[key], step.completed);
    if (step.committed && !step.missing.empty()) {
      return Corrupt(path,
                     absl::StrCat("exactly-once violated: step ", step.step, " committed with ",
                                  RangeText(step.missing[0]), " missing"));
    }
  }

  // The derived tables must hold exactly what the events imply.
  {
    std::map<StepKey, std::map<int32_t, int64_t>> table;
    LOCKSTEP_ASSIGN_OR_RETURN(
        SqliteStatement rows,
        db.Prepare("SELECT step, dp_rank, batch_index, num_tokens FROM planned"));
    while (true) {
      LOCKSTEP_ASSIGN_OR_RETURN(bool row, rows.Step());
      if (!row) break;
      table[{rows.ColumnInt(0), static_cast<int>(rows.ColumnInt(1))}]
           [static_cast<int32_t>(rows.ColumnInt(2))] = rows.ColumnInt(3);
    }
    std::map<StepKey, std::map<int32_t, int64_t>> expected;
    for (const auto& [key, sequences] : planned) {
      if (!sequences.empty()) expected[key] = sequences;
    }
    if (table != expected) return Corrupt(path, "table planned disagrees with the events");
  }
  {
    std::set<std::tuple<int64_t, int, int32_t, int64_t, int64_t, int64_t>> table;
    LOCKSTEP_ASSIGN_OR_RETURN(SqliteStatement rows,
                              db.Prepare("SELECT step, dp_rank, batch_index, token_begin, "
                                         "token_end, event_seq FROM contributions"));
    while (true) {
      LOCKSTEP_ASSIGN_OR_RETURN(bool row, rows.Step());
      if (!row) break;
      table.emplace(rows.ColumnInt(0), static_cast<int>(rows.ColumnInt(1)),
                    static_cast<int32_t>(rows.ColumnInt(2)), rows.ColumnInt(3), rows.ColumnInt(4),
                    rows.ColumnInt(5));
    }
    if (table != contributions) {
      return Corrupt(path, "table contributions disagrees with the events");
    }
  }
  {
    std::map<StepKey, int64_t> table;
    LOCKSTEP_ASSIGN_OR_RETURN(SqliteStatement rows,
                              db.Prepare("SELECT step, dp_rank, event_seq FROM commits"));
    while (true) {
      LOCKSTEP_ASSIGN_OR_RETURN(bool row, rows.Step());
      if (!row) break;
      table[{rows.ColumnInt(0), static_cast<int>(rows.ColumnInt(1))}] = rows.ColumnInt(2);
    }
    if (table != commits) return Corrupt(path, "table commits disagrees with the events");
  }
  return verified;
}

absl::Status Fsync(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("opening ", path, ": ", strerror(errno)));
  const int rc = fsync(fd);
  const int saved = errno;
  close(fd);
  if (rc != 0) return absl::InternalError(absl::StrCat("fsync ", path, ": ", strerror(saved)));
  return absl::OkStatus();
}

// The directory holding `path` (its entry is what a new file's directory fsync makes durable).
std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash + 1);
}

// Creates an empty ledger at `path` atomically: the schema is built in a temporary file beside
// it, which is closed (so nothing remains in its WAL) and renamed into place, so a crash leaves
// either no ledger or a complete empty one.
absl::Status CreateLedgerFile(const std::string& path) {
  const std::string temp = absl::StrCat(path, ".creating.", getpid());
  unlink(temp.c_str());
  absl::Status status = [&]() -> absl::Status {
    LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<SqliteDb> db, SqliteDb::Open(temp, true));
    LOCKSTEP_RETURN_IF_ERROR(db->Exec("PRAGMA journal_mode=WAL"));
    LOCKSTEP_RETURN_IF_ERROR(db->Exec("PRAGMA synchronous=FULL"));
    LOCKSTEP_RETURN_IF_ERROR(db->Exec("BEGIN IMMEDIATE"));
    absl::Status schema = db->Exec(kSchema);
    if (schema.ok()) schema = db->Exec(absl::StrCat("PRAGMA application_id=", kApplicationId));
    if (schema.ok()) schema = db->Exec(absl::StrCat("PRAGMA user_version=", kSchemaVersion));
    if (!schema.ok()) {
      db->Exec("ROLLBACK").IgnoreError();
      return schema;
    }
    LOCKSTEP_RETURN_IF_ERROR(db->Exec("COMMIT"));
    db.reset();  // closing checkpoints the WAL into the file and removes it
    LOCKSTEP_RETURN_IF_ERROR(Fsync(temp));
    if (link(temp.c_str(), path.c_str()) != 0) {
      // link, not rename: never replace a ledger another writer created meanwhile.
      if (errno == EEXIST) {
        return absl::FailedPreconditionError(
            absl::StrCat("ledger ", path, " appeared while this writer was creating it"));
      }
      return absl::InternalError(absl::StrCat("creating ledger ", path, ": ", strerror(errno)));
    }
    return Fsync(DirectoryOf(path));
  }();
  RemoveLedgerFiles(temp);
  return status;
}

}  // namespace

void RemoveLedgerFiles(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm"}) unlink(absl::StrCat(path, suffix).c_str());
}

absl::string_view LedgerEventKindName(LedgerEventKind kind) {
  return kKindNames[static_cast<int>(kind)];
}

std::string FormatTokenRanges(const std::vector<TokenRange>& ranges) {
  return absl::StrJoin(ranges, ";", [](std::string* out, const TokenRange& r) {
    absl::StrAppend(out, r.batch_index, ":", r.begin, "-", r.end);
  });
}

const StepReplay* LedgerReplay::Find(int64_t step, int dp_rank) const {
  for (const StepReplay& s : steps) {
    if (s.step == step && s.dp_rank == dp_rank) return &s;
  }
  return nullptr;
}

int64_t LedgerReplay::LastCommittedStep(int dp_rank) const {
  int64_t last = -1;
  for (const StepReplay& s : steps) {
    if (s.dp_rank == dp_rank && s.committed) last = std::max(last, s.step);
  }
  return last;
}

std::string LedgerReplay::Summary() const {
  std::string out = absl::StrCat(events.size(), " events, ", steps.size(), " steps\n");
  for (const StepReplay& s : steps) {
    absl::StrAppend(&out, "step ", s.step, " dp ", s.dp_rank, ": ",
                    s.committed ? "committed" : "not committed", ", ", s.completed_tokens, "/",
                    s.planned_tokens, " tokens completed;");
    for (int k = 0; k < kNumKinds; ++k) {
      if (s.event_counts[k] > 0) absl::StrAppend(&out, " ", kKindNames[k], "=", s.event_counts[k]);
    }
    if (!s.missing.empty()) {
      absl::StrAppend(&out, "; missing ", FormatTokenRanges(s.missing));
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

Ledger::Ledger(std::string path, LedgerOptions options, int lock_fd,
               std::unique_ptr<internal::SqliteDb> db, std::string chain, int64_t next_seq)
    : path_(std::move(path)),
      options_(options),
      lock_fd_(lock_fd),
      db_(std::move(db)),
      chain_(std::move(chain)),
      next_seq_(next_seq) {}

Ledger::~Ledger() {
  // Callers that must know wait with AwaitDurable first; a failure only seen here is logged.
  if (absl::Status durable = AwaitDurable(); !durable.ok()) {
    LOCKSTEP_LOG(ERROR) << "ledger " << path_ << ": closed after a failed write: " << durable;
  }
  if (writer_thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      stopping_ = true;
    }
    queue_cv_.notify_all();
    writer_thread_.join();
  }
  db_.reset();
  close(lock_fd_);
}

void Ledger::WriterLoop() {
  std::unique_lock<std::mutex> lock(queue_mu_);
  while (true) {
    queue_cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) return;  // stopping, nothing pending
    std::function<absl::Status()> write = std::move(queue_.front());
    queue_.pop_front();
    if (!queue_error_.ok()) continue;  // nothing after a failed write is written
    writing_ = true;
    lock.unlock();
    absl::Status written;
    try {
      written = write();
    } catch (const std::exception& e) {
      written =
          absl::InternalError(absl::StrCat("ledger ", path_, ": a queued write threw: ", e.what()));
    }
    lock.lock();
    writing_ = false;
    if (!written.ok()) queue_error_ = written;
    queue_cv_.notify_all();
  }
}

absl::Status Ledger::Enqueue(std::function<absl::Status()> write) {
  std::unique_lock<std::mutex> lock(queue_mu_);
  queue_cv_.wait(lock, [&] {
    return static_cast<int>(queue_.size()) < kMaxQueuedWrites || !queue_error_.ok();
  });
  if (!queue_error_.ok()) return queue_error_;
  if (!writer_thread_.joinable()) {
    try {
      writer_thread_ = std::thread([this] { WriterLoop(); });
    } catch (const std::system_error& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat("ledger ", path_, ": starting its writer thread: ", e.what()));
    }
  }
  queue_.push_back(std::move(write));
  lock.unlock();
  queue_cv_.notify_all();
  return absl::OkStatus();
}

absl::Status Ledger::SyncWal() {
  // The WAL's data, and once its directory entry (as SQLite's own sync does for a new file).
  LOCKSTEP_RETURN_IF_ERROR(Fsync(absl::StrCat(path_, "-wal")));
  if (!wal_dir_synced_) {
    LOCKSTEP_RETURN_IF_ERROR(Fsync(DirectoryOf(path_)));
    wal_dir_synced_ = true;
  }
  return absl::OkStatus();
}

absl::Status Ledger::QueuedError() {
  std::lock_guard<std::mutex> lock(queue_mu_);
  return queue_error_;
}

absl::Status Ledger::AwaitDurable() {
  std::unique_lock<std::mutex> lock(queue_mu_);
  queue_cv_.wait(lock, [&] { return (queue_.empty() && !writing_) || !queue_error_.ok(); });
  // After a failure the writer may still be dropping the writes queued after it; they are never
  // written, so the ledger is settled.
  return queue_error_;
}

absl::StatusOr<std::unique_ptr<Ledger>> Ledger::OpenWriter(const std::string& path,
                                                           const LedgerOptions& options) {
  if (options.dp_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ledger ", path, ": dp_rank ", options.dp_rank, " is negative"));
  }
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    if (errno != ENOENT) {
      return absl::InternalError(absl::StrCat("ledger ", path, ": ", strerror(errno)));
    }
    absl::Status created = CreateLedgerFile(path);
    if (!created.ok() && !absl::IsFailedPrecondition(created)) return created;
  }
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("opening ledger ", path, ": ", strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int saved = errno;
    close(fd);
    if (saved == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("ledger ", path, " already has a writer; a ledger has one writer"));
    }
    return absl::InternalError(absl::StrCat("locking ledger ", path, ": ", strerror(saved)));
  }
  absl::StatusOr<std::unique_ptr<SqliteDb>> db = SqliteDb::Open(path, /*create=*/false);
  absl::StatusOr<Verified> verified =
      db.ok() ? LoadAndVerify(**db) : absl::StatusOr<Verified>(db.status());
  absl::Status mode = verified.ok() ? (*db)->Exec("PRAGMA journal_mode=WAL") : verified.status();
  if (mode.ok()) {
    mode = (*db)->Exec(options.fsync_every_event ? "PRAGMA synchronous=FULL"
                                                 : "PRAGMA synchronous=NORMAL");
  }
  if (!mode.ok()) {
    if (db.ok()) db->reset();
    close(fd);
    return mode;
  }
  std::unique_ptr<Ledger> ledger(new Ledger(path, options, fd, std::move(*db),
                                            std::move(verified->chain), verified->next_seq));
  for (const StepReplay& step : verified->replay.steps) {
    if (step.dp_rank == options.dp_rank && step.step >= ledger->last_begun_step_) {
      ledger->last_begun_step_ = step.step;
      ledger->last_begun_committed_ = step.committed;
    }
  }
  return ledger;
}

absl::StatusOr<LedgerReplay> Ledger::Replay(const std::string& path) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<SqliteDb> db, SqliteDb::Open(path, false));
  LOCKSTEP_ASSIGN_OR_RETURN(Verified verified, LoadAndVerify(*db));
  return std::move(verified.replay);
}

absl::StatusOr<int64_t> Ledger::Append(const LedgerEvent& input) {
  LedgerEvent event = input;
  event.dp_rank = options_.dp_rank;
  event.seq = next_seq_;
  const std::string ranges = FormatTokenRanges(event.ranges);
  const std::string chain = ChainOf(chain_, event, ranges);
  {
    LOCKSTEP_ASSIGN_OR_RETURN(
        SqliteStatement insert,
        db_->Prepare("INSERT INTO events(seq, step, dp_rank, kind, microbatch, ranges, detail, "
                     "chain) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"));
    LOCKSTEP_RETURN_IF_ERROR(insert.BindInt(1, event.seq));
    LOCKSTEP_RETURN_IF_ERROR(insert.BindInt(2, event.step));
    LOCKSTEP_RETURN_IF_ERROR(insert.BindInt(3, event.dp_rank));
    LOCKSTEP_RETURN_IF_ERROR(insert.BindText(4, LedgerEventKindName(event.kind)));
    LOCKSTEP_RETURN_IF_ERROR(insert.BindText(5, event.microbatch));
    LOCKSTEP_RETURN_IF_ERROR(insert.BindText(6, ranges));
    LOCKSTEP_RETURN_IF_ERROR(insert.BindText(7, event.detail));
    LOCKSTEP_RETURN_IF_ERROR(insert.BindBlob(8, chain));
    LOCKSTEP_RETURN_IF_ERROR(insert.Run());
  }
  if (event.kind == LedgerEventKind::kCompleted) {
    LOCKSTEP_ASSIGN_OR_RETURN(
        SqliteStatement insert,
        db_->Prepare("INSERT INTO contributions(step, dp_rank, batch_index, token_begin, "
                     "token_end, event_seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"));
    for (const TokenRange& r : event.ranges) {
      insert.Reset();
      LOCKSTEP_RETURN_IF_ERROR(insert.BindInt(1, event.step));
      LOCKSTEP_RETURN_IF_ERROR(insert.BindInt(2, event.dp_rank));
      LOCKSTEP_RETURN_IF_ERROR(insert.BindInt(3, r.batch_index));
      LOCKSTEP_RETURN_IF_ERROR(insert.BindInt(4, r.begin));
      LOCKSTEP_RETURN_IF_ERROR(insert.BindInt(5, r.end));
      LOCKSTEP_RETURN_IF_ERROR(insert.BindInt(6, event.seq));
      LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
          insert.Run(),
          absl::StrCat(RangeText(r), " of step ", event.step, ", microbatch ", event.microbatch));
    }
  }
  if (event.kind == LedgerEventKind::kStepCommitted) {
    LOCKSTEP_ASSIGN_OR_RETURN(
        SqliteStatement insert,
        db_->Prepare("INSERT INTO commits(step, dp_rank, event_seq) VALUES (?1, ?2, ?3)"));
    LOCKSTEP_RETURN_IF_ERROR(insert.BindInt(1, event.step));
    LOCKSTEP_RETURN_IF_ERROR(insert.BindInt(2, event.dp_rank));
    LOCKSTEP_RETURN_IF_ERROR(insert.BindInt(3, event.seq));
    LOCKSTEP_RETURN_IF_ERROR(insert.Run());
  }
  chain_ = chain;
  next_seq_ = event.seq + 1;
  return event.seq;
}

namespace {

// Runs `body` inside BEGIN IMMEDIATE ... COMMIT, rolling back on any error.
template <typename Body>
absl::Status InTransaction(SqliteDb& db, Body body) {
  LOCKSTEP_RETURN_IF_ERROR(db.Exec("BEGIN IMMEDIATE"));
  absl::Status status = body();
  if (status.ok()) status = db.Exec("COMMIT");
  if (!status.ok()) db.Exec("ROLLBACK").IgnoreError();
  return status;
}

// Whether (step, dp_rank) began and whether it committed.
absl::Status StepState(SqliteDb& db, int64_t step, int dp_rank, bool* begun, bool* committed) {
  LOCKSTEP_ASSIGN_OR_RETURN(SqliteStatement query,
                            db.Prepare("SELECT (SELECT COUNT(*) FROM planned WHERE step = ?1 AND "
                                       "dp_rank = ?2), (SELECT COUNT(*) FROM commits WHERE step "
                                       "= ?1 AND dp_rank = ?2)"));
  LOCKSTEP_RETURN_IF_ERROR(query.BindInt(1, step));
  LOCKSTEP_RETURN_IF_ERROR(query.BindInt(2, dp_rank));
  LOCKSTEP_ASSIGN_OR_RETURN(bool row, query.Step());
  if (!row) return absl::InternalError("step state query returned no row");
  *begun = query.ColumnInt(0) > 0;
  *committed = query.ColumnInt(1) > 0;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::map<int32_t, int64_t>> Ledger::CheckPlan(
    int64_t step, const std::vector<PlannedMicrobatch>& microbatches) const {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat(StepWhere(step), ": negative step"));
  if (microbatches.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(StepWhere(step), ": no microbatches"));
  }
  std::set<std::string> ids;
  std::map<int32_t, std::vector<TokenRange>> by_sequence;
  for (const PlannedMicrobatch& m : microbatches) {
    if (m.id.empty() || !ids.insert(m.id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(StepWhere(step), ": microbatch id '", m.id, "' is empty or repeated"));
    }
    if (m.ranges.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(StepWhere(step), ": microbatch ", m.id, " holds no tokens"));
    }
    for (const TokenRange& r : m.ranges) {
      if (r.batch_index < 0 || r.begin < 0 || r.end <= r.begin) {
        return absl::InvalidArgumentError(absl::StrCat(StepWhere(step), ": microbatch ", m.id,
                                                       " has ", RangeText(r),
                                                       ", which is not a range"));
      }
      by_sequence[r.batch_index].push_back(r);
    }
  }
  std::map<int32_t, int64_t> tokens;
  for (auto& [index, ranges] : by_sequence) {
    std::vector<TokenRange> sorted = ranges;
    std::sort(sorted.begin(), sorted.end(),
              [](const TokenRange& a, const TokenRange& b) { return a.begin < b.begin; });
    int64_t at = 0;
    for (const TokenRange& r : sorted) {
      if (r.begin != at) {
        return absl::InvalidArgumentError(
            absl::StrCat(StepWhere(step), ": the microbatches do not tile sequence ", index, ": ",
                         r.begin > at ? "gap" : "overlap", " at token ", std::min(at, r.begin)));
      }
      at = r.end;
    }
    tokens[index] = at;
  }
  return tokens;
}

absl::Status Ledger::CheckMayBegin(int64_t step) const {
  // Steps begin in increasing order, each after the previous one committed, so the last begun
  // step says everything: every earlier one committed.
  if (last_begun_step_ < 0) return absl::OkStatus();
  if (step == last_begun_step_) {
    return absl::FailedPreconditionError(
        absl::StrCat(StepWhere(step), last_begun_committed_ ? ": already committed"
                                                            : ": already begun (continue it)"));
  }
  if (!last_begun_committed_) {
    return absl::FailedPreconditionError(
        absl::StrCat(StepWhere(step), ": step ", last_begun_step_, " began and has not committed"));
  }
  if (step < last_begun_step_) {
    return absl::FailedPreconditionError(
        absl::StrCat(StepWhere(step), ": not after the last committed step ", last_begun_step_));
  }
  return absl::OkStatus();
}

absl::Status Ledger::InChainTransaction(const std::function<absl::Status()>& body) {
  const std::string saved_chain = chain_;
  const int64_t saved_seq = next_seq_;
  absl::Status status = InTransaction(*db_, body);
  if (!status.ok()) {
    chain_ = saved_chain;
    next_seq_ = saved_seq;
  }
  return status;
}

absl::Status Ledger::ClosedStepRefusal(int64_t step, absl::string_view where,
                                       absl::string_view committed_text) const {
  // Once every queued write is written (the direct calls await that), the account matches the
  // file, where at most the last begun step is open: a step the account does not hold open
  // either never began or committed, and only the file still tells which.
  bool begun = false, committed = false;
  LOCKSTEP_RETURN_IF_ERROR(StepState(*db_, step, options_.dp_rank, &begun, &committed));
  return absl::FailedPreconditionError(
      absl::StrCat(where, begun ? committed_text : ": the step never began"));
}

std::string Ledger::StepWhere(int64_t step) const {
  return absl::StrCat("ledger ", path_, ", step ", step);
}

absl::Status Ledger::WriteBegin(int64_t step, const std::map<int32_t, int64_t>& tokens,
                                const std::vector<PlannedMicrobatch>& microbatches) {
  absl::Status status = InChainTransaction([&]() -> absl::Status {
    LOCKSTEP_ASSIGN_OR_RETURN(
        SqliteStatement insert,
        db_->Prepare("INSERT INTO planned(step, dp_rank, batch_index, num_tokens) VALUES (?1, "
                     "?2, ?3, ?4)"));
    for (const auto& [index, count] : tokens) {
      insert.Reset();
      LOCKSTEP_RETURN_IF_ERROR(insert.BindInt(1, step));
      LOCKSTEP_RETURN_IF_ERROR(insert.BindInt(2, options_.dp_rank));
      LOCKSTEP_RETURN_IF_ERROR(insert.BindInt(3, index));
      LOCKSTEP_RETURN_IF_ERROR(insert.BindInt(4, count));
      LOCKSTEP_RETURN_IF_ERROR(insert.Run());
    }
    for (const PlannedMicrobatch& m : microbatches) {
      LOCKSTEP_RETURN_IF_ERROR(
          Append(LedgerEvent::Of(LedgerEventKind::kPlanned, step, m.id, m.ranges)).status());
    }
    return absl::OkStatus();
  });
  if (!status.ok()) {
    return Annotate(status, absl::StrCat("ledger ", path_, ", beginning step ", step));
  }
  return absl::OkStatus();
}

absl::Status Ledger::BeginStep(int64_t step, const std::vector<PlannedMicrobatch>& microbatches) {
  LOCKSTEP_RETURN_IF_ERROR(AwaitDurable());
  LOCKSTEP_ASSIGN_OR_RETURN(const auto tokens, CheckPlan(step, microbatches));
  LOCKSTEP_RETURN_IF_ERROR(CheckMayBegin(step));
  LOCKSTEP_RETURN_IF_ERROR(WriteBegin(step, tokens, microbatches));
  last_begun_step_ = step;
  last_begun_committed_ = false;
  return absl::OkStatus();
}

absl::Status Ledger::QueueBeginStep(int64_t step, std::vector<PlannedMicrobatch> microbatches) {
  LOCKSTEP_RETURN_IF_ERROR(QueuedError());  // before refusals that trust the account
  LOCKSTEP_ASSIGN_OR_RETURN(auto tokens, CheckPlan(step, microbatches));
  LOCKSTEP_RETURN_IF_ERROR(CheckMayBegin(step));
  LOCKSTEP_RETURN_IF_ERROR(
      Enqueue([this, step, tokens = std::move(tokens), microbatches = std::move(microbatches)] {
        return WriteBegin(step, tokens, microbatches);
      }));
  last_begun_step_ = step;
  last_begun_committed_ = false;
  return absl::OkStatus();
}

namespace {
// Where a call recording `event` failed or was refused (built only then).
std::string WhereOf(const std::string& path, const LedgerEvent& event) {
  return absl::StrCat("ledger ", path, ", step ", event.step, ", ", LedgerEventKindName(event.kind),
                      " ", event.microbatch);
}
absl::Status CheckRecordedKind(const LedgerEvent& event, const std::string& path) {
  if (event.kind == LedgerEventKind::kPlanned || event.kind == LedgerEventKind::kStepCommitted) {
    return absl::InvalidArgumentError(
        absl::StrCat(WhereOf(path, event), ": recorded by BeginStep and CommitStep, not Record"));
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<int64_t> Ledger::WriteRecord(const LedgerEvent& event) {
  int64_t seq = 0;
  absl::Status status = InChainTransaction([&]() -> absl::Status {
    LOCKSTEP_ASSIGN_OR_RETURN(seq, Append(event));
    return absl::OkStatus();
  });
  if (!status.ok()) return Annotate(status, WhereOf(path_, event));
  return seq;
}

absl::StatusOr<int64_t> Ledger::Record(const LedgerEvent& event) {
  LOCKSTEP_RETURN_IF_ERROR(AwaitDurable());
  LOCKSTEP_RETURN_IF_ERROR(CheckRecordedKind(event, path_));
  if (!IsOpen(event.step)) {
    return ClosedStepRefusal(event.step, WhereOf(path_, event), ": the step already committed");
  }
  return WriteRecord(event);
}

absl::Status Ledger::QueueRecord(LedgerEvent event) {
  LOCKSTEP_RETURN_IF_ERROR(QueuedError());
  LOCKSTEP_RETURN_IF_ERROR(CheckRecordedKind(event, path_));
  // Only the last begun step can be open (CheckMayBegin).
  if (!IsOpen(event.step)) {
    return absl::FailedPreconditionError(absl::StrCat(
        WhereOf(path_, event),
        event.step == last_begun_step_
            ? std::string(": the step already committed")
            : absl::StrCat(": the step is not the open one (",
                           last_begun_committed_ ? std::string("none is open")
                                                 : absl::StrCat("step ", last_begun_step_),
                           ")")));
  }
  return Enqueue([this, event = std::move(event)] { return WriteRecord(event).status(); });
}

absl::Status Ledger::WriteCommit(int64_t step, absl::string_view detail, bool fsync_now) {
  const std::string where = absl::StrCat("ledger ", path_, ", committing step ", step);
  {
    std::map<int32_t, int64_t> planned;
    std::vector<TokenRange> completed;
    LOCKSTEP_ASSIGN_OR_RETURN(
        SqliteStatement rows,
        db_->Prepare("SELECT batch_index, num_tokens FROM planned WHERE step = ?1 AND dp_rank = "
                     "?2"));
    LOCKSTEP_RETURN_IF_ERROR(rows.BindInt(1, step));
    LOCKSTEP_RETURN_IF_ERROR(rows.BindInt(2, options_.dp_rank));
    while (true) {
      LOCKSTEP_ASSIGN_OR_RETURN(bool row, rows.Step());
      if (!row) break;
      planned[static_cast<int32_t>(rows.ColumnInt(0))] = rows.ColumnInt(1);
    }
    LOCKSTEP_ASSIGN_OR_RETURN(
        SqliteStatement done,
        db_->Prepare("SELECT batch_index, token_begin, token_end FROM contributions WHERE step = "
                     "?1 AND dp_rank = ?2"));
    LOCKSTEP_RETURN_IF_ERROR(done.BindInt(1, step));
    LOCKSTEP_RETURN_IF_ERROR(done.BindInt(2, options_.dp_rank));
    while (true) {
      LOCKSTEP_ASSIGN_OR_RETURN(bool row, done.Step());
      if (!row) break;
      completed.push_back(
          {static_cast<int32_t>(done.ColumnInt(0)), done.ColumnInt(1), done.ColumnInt(2)});
    }
    const std::vector<TokenRange> missing = Missing(planned, Merged(completed));
    if (!missing.empty()) {
      int64_t tokens = 0;
      for (const TokenRange& r : missing) tokens += r.end - r.begin;
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": ", tokens, " planned tokens did not complete, first ",
                       RangeText(missing[0]), " (exactly-once: nothing may be lost)"));
    }
  }
  if (fsync_now) LOCKSTEP_RETURN_IF_ERROR(db_->Exec("PRAGMA synchronous=FULL"));
  absl::Status status = InChainTransaction([&]() -> absl::Status {
    return Append(
               LedgerEvent::Of(LedgerEventKind::kStepCommitted, step, "", {}, std::string(detail)))
        .status();
  });
  if (fsync_now) {
    // synchronous is a connection setting: restore it even after a failed commit. Should that
    // fail, later events stay fsynced (slower, never less durable) and the commit stands.
    db_->Exec("PRAGMA synchronous=NORMAL").IgnoreError();
  }
  return Annotate(status, where);
}

absl::Status Ledger::CommitStep(int64_t step, absl::string_view detail, CommitSync sync) {
  LOCKSTEP_RETURN_IF_ERROR(AwaitDurable());
  if (!IsOpen(step)) {
    return ClosedStepRefusal(step, absl::StrCat("ledger ", path_, ", committing step ", step),
                             ": already committed");
  }
  // With fsync_every_event every transaction is fsynced already.
  const bool fsync_needed = FsyncsAtCommit();
  const bool in_background = fsync_needed && sync == CommitSync::kInBackground;
  LOCKSTEP_RETURN_IF_ERROR(WriteCommit(step, detail, fsync_needed && !in_background));
  if (step == last_begun_step_) last_begun_committed_ = true;
  if (in_background) {
    return Enqueue([this, step] {
      LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(SyncWal(),
                                            absl::StrCat("ledger ", path_, ": making step ", step,
                                                         "'s commit durable in the background"));
      return absl::OkStatus();
    });
  }
  return absl::OkStatus();
}

absl::Status Ledger::QueueCommitStep(int64_t step, std::string detail) {
  LOCKSTEP_RETURN_IF_ERROR(QueuedError());
  if (!IsOpen(step)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ledger ", path_, ", committing step ", step,
        step == last_begun_step_ ? ": already committed" : ": the step is not the open one"));
  }
  const bool fsync_now = FsyncsAtCommit();
  LOCKSTEP_RETURN_IF_ERROR(Enqueue([this, step, detail = std::move(detail), fsync_now] {
    return WriteCommit(step, detail, fsync_now);
  }));
  last_begun_committed_ = true;
  return absl::OkStatus();
}

}  // namespace admission
}  // namespace lockstep
