// admission/ledger.cc: the ledger's writes (ledger.h), direct and queued, and its replay's
// queries. Opening a ledger is ledger_open.cc's.

#include "admission/ledger.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "admission/internal/ledger_head.h"
#include "admission/internal/ledger_schema.h"
#include "admission/internal/ledger_verify.h"
#include "admission/internal/serial_writer.h"
#include "admission/internal/sqlite.h"
#include "base/file_io.h"
#include "base/logging.h"
#include "base/status_macros.h"

namespace lockstep {
namespace admission {
namespace {

using internal::ChainOf;
using internal::LedgerHead;
using internal::Merged;
using internal::Missing;
using internal::RangeText;
using internal::SqliteDb;
using internal::SqliteStatement;

}  // namespace

void RemoveLedgerFiles(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm", "-head"}) {
    unlink(absl::StrCat(path, suffix).c_str());
  }
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
    for (int k = 0; k < internal::kNumKinds; ++k) {
      if (s.event_counts[k] > 0) {
        absl::StrAppend(&out, " ", LedgerEventKindName(static_cast<LedgerEventKind>(k)), "=",
                        s.event_counts[k]);
      }
    }
    if (!s.missing.empty()) {
      absl::StrAppend(&out, "; missing ", FormatTokenRanges(s.missing));
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

Ledger::Ledger(std::string path, LedgerOptions options, int lock_fd,
               std::unique_ptr<internal::SqliteDb> db, std::string ledger_id, std::string chain,
               int64_t next_seq, std::unique_ptr<internal::LedgerHeadWriter> head)
    : path_(std::move(path)),
      options_(options),
      lock_fd_(lock_fd),
      db_(std::move(db)),
      ledger_id_(std::move(ledger_id)),
      head_(std::move(head)),
      chain_(std::move(chain)),
      next_seq_(next_seq),
      writer_(std::make_unique<internal::SerialWriter>(absl::StrCat("ledger ", path_),
                                                       kMaxQueuedWrites)) {}

Ledger::~Ledger() {
  // Callers that must know wait with AwaitDurable first; a failure only seen here is logged.
  if (absl::Status durable = AwaitDurable(); !durable.ok()) {
    LOCKSTEP_LOG(ERROR) << "ledger " << path_ << ": closed after a failed write: " << durable;
  }
  writer_.reset();  // before the database it writes to
  head_.reset();
  db_.reset();
  close(lock_fd_);
}

absl::Status Ledger::Enqueue(std::function<absl::Status()> write) {
  return writer_->Enqueue(std::move(write));
}

absl::Status Ledger::SyncWal() {
  // The WAL's data, and once its directory entry (as SQLite's own sync does for a new file).
  // Whatever the OS says, a WAL that cannot be made durable is this ledger's internal failure
  // (AwaitDurable's contract), not a code the caller could act on.
  auto internal = [](absl::Status s) { return s.ok() ? s : absl::InternalError(s.message()); };
  LOCKSTEP_RETURN_IF_ERROR(internal(SyncPath(absl::StrCat(path_, "-wal"))));
  if (!wal_dir_synced_) {
    LOCKSTEP_RETURN_IF_ERROR(internal(SyncParentDirectory(path_)));
    wal_dir_synced_ = true;
  }
  return absl::OkStatus();
}

void Ledger::AdvanceHead(int64_t seq, const std::string& chain) {
  LedgerHead head;
  head.ledger_id = ledger_id_;
  head.dp_rank = options_.dp_rank;
  head.seq = seq;
  head.chain = chain;
  if (absl::Status written = head_->Write(head); !written.ok()) {
    LOCKSTEP_LOG(ERROR) << "ledger " << path_ << ": the head stays before event " << seq
                        << " (allowed; the commit stands): " << written;
  }
}

absl::Status Ledger::QueuedError() { return writer_->error(); }

absl::Status Ledger::AwaitDurable() { return writer_->AwaitIdle(); }

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
  if (status.ok() && (fsync_now || options_.fsync_every_event)) AdvanceHead(next_seq_ - 1, chain_);
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
    return Enqueue([this, step, seq = next_seq_ - 1, chain = chain_] {
      LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(SyncWal(),
                                            absl::StrCat("ledger ", path_, ": making step ", step,
                                                         "'s commit durable in the background"));
      AdvanceHead(seq, chain);
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
