#include "admission/internal/ledger_schema.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "admission/internal/ledger_head.h"
#include "admission/internal/sqlite.h"
#include "base/file_io.h"
#include "base/logging.h"
#include "base/sha256.h"
#include "base/status_macros.h"

namespace lockstep {
namespace admission {
namespace internal {
namespace {

constexpr absl::string_view kChainTag = "lockstep/admission/ledger-event/v1";

constexpr absl::string_view kSchema = R"sql(
CREATE TABLE identity(
  only INTEGER PRIMARY KEY CHECK (only = 1),
  ledger_id TEXT NOT NULL CHECK (length(ledger_id) = 32),
  dp_rank INTEGER NOT NULL CHECK (dp_rank >= 0));
CREATE TRIGGER identity_no_update BEFORE UPDATE ON identity
BEGIN SELECT RAISE(ABORT, 'a ledger''s identity never changes'); END;
CREATE TRIGGER identity_no_delete BEFORE DELETE ON identity
BEGIN SELECT RAISE(ABORT, 'a ledger''s identity never changes'); END;
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

// The schema's entries by name: their type, table and statement.
absl::Status ReadSchema(SqliteDb& db, std::map<std::string, std::string>& rows) {
  LOCKSTEP_ASSIGN_OR_RETURN(
      SqliteStatement query,
      db.Prepare("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name"));
  while (true) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, query.Step());
    if (!row) break;
    rows[absl::StrCat(query.ColumnText(0), " ", query.ColumnText(1))] =
        absl::StrCat(query.ColumnText(2), "\n", query.ColumnText(3));
  }
  return absl::OkStatus();
}

}  // namespace

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

absl::Status VerifySchema(SqliteDb& db) {
  // What this build's schema statements make, read back from a database that holds nothing else.
  static const auto* const expected = [] {
    auto* rows = new std::map<std::string, std::string>();
    absl::StatusOr<std::unique_ptr<SqliteDb>> memory = SqliteDb::Open(":memory:", true);
    LOCKSTEP_CHECK(memory.ok() && (*memory)->Exec(kSchema).ok())
        << "the ledger schema does not build: " << memory.status();
    LOCKSTEP_CHECK(ReadSchema(**memory, *rows).ok());
    return rows;
  }();
  std::map<std::string, std::string> found;
  LOCKSTEP_RETURN_IF_ERROR(ReadSchema(db, found));
  for (const auto& [name, sql] : *expected) {
    const auto it = found.find(name);
    if (it == found.end()) {
      return absl::DataLossError(
          absl::StrCat("ledger ", db.path(), " is not intact: its schema lacks ", name));
    }
    if (it->second != sql) {
      return absl::DataLossError(absl::StrCat("ledger ", db.path(), " is not intact: its schema's ",
                                              name, " differs from this build's (edited)"));
    }
  }
  for (const auto& [name, sql] : found) {
    if (expected->count(name) == 0) {
      return absl::DataLossError(absl::StrCat("ledger ", db.path(),
                                              " is not intact: its schema has ", name,
                                              ", which a ledger does not"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CreateLedgerFile(const std::string& path, int dp_rank) {
  const std::string temp = absl::StrCat(path, ".creating.", getpid(), ".", NewLedgerId());
  const std::string ledger_id = NewLedgerId();
  absl::Status status = [&]() -> absl::Status {
    {
      LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<SqliteDb> db, SqliteDb::Open(temp, true));
      // A rollback journal while creating: once COMMIT returns, the file itself holds everything
      // (a WAL would hold it until a checkpoint that can still fail, on a full disk, at close).
      LOCKSTEP_RETURN_IF_ERROR(db->Exec("PRAGMA journal_mode=DELETE"));
      LOCKSTEP_RETURN_IF_ERROR(db->Exec("PRAGMA synchronous=FULL"));
      LOCKSTEP_RETURN_IF_ERROR(db->Exec("BEGIN IMMEDIATE"));
      absl::Status schema = db->Exec(kSchema);
      if (schema.ok()) schema = db->Exec(absl::StrCat("PRAGMA application_id=", kApplicationId));
      if (schema.ok()) schema = db->Exec(absl::StrCat("PRAGMA user_version=", kSchemaVersion));
      if (schema.ok()) {
        schema =
            db->Exec(absl::StrCat("INSERT INTO identity(only, ledger_id, dp_rank) VALUES (1, '",
                                  ledger_id, "', ", dp_rank, ")"));
      }
      if (schema.ok()) schema = db->Exec("COMMIT");
      if (!schema.ok()) {
        db->Exec("ROLLBACK").IgnoreError();
        return schema;
      }
    }
    // Read back before it is published: a file that does not hold all of it is never linked.
    {
      LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<SqliteDb> db, SqliteDb::Open(temp, false));
      LOCKSTEP_RETURN_IF_ERROR(VerifySchema(*db));
      LOCKSTEP_ASSIGN_OR_RETURN(int64_t rows, db->QueryInt("SELECT COUNT(*) FROM identity"));
      if (rows != 1)
        return absl::DataLossError(absl::StrCat("creating ledger ", path, ": no identity"));
    }
    LOCKSTEP_RETURN_IF_ERROR(SyncPath(temp));
    if (link(temp.c_str(), path.c_str()) != 0) {
      // link, not rename: never replace a ledger another writer created meanwhile.
      if (errno == EEXIST) {
        return absl::FailedPreconditionError(
            absl::StrCat("ledger ", path, " appeared while this writer was creating it"));
      }
      return absl::InternalError(absl::StrCat("creating ledger ", path, ": ", strerror(errno)));
    }
    LOCKSTEP_RETURN_IF_ERROR(SyncParentDirectory(path));
    // The head after the link: the ledger that won a race of creators is the one it names. A
    // crash before it leaves a ledger without events and without a head, which the next open
    // gives its head (Note [The ledger's head record]).
    LedgerHead head;
    head.ledger_id = ledger_id;
    head.dp_rank = dp_rank;
    head.chain = GenesisChain(ledger_id, dp_rank);
    return CreateLedgerHead(path, head);
  }();
  RemoveLedgerFiles(temp);
  if (!status.ok()) return status;
  return ledger_id;
}

}  // namespace internal

absl::string_view LedgerEventKindName(LedgerEventKind kind) {
  return internal::kKindNames[static_cast<int>(kind)];
}

}  // namespace admission
}  // namespace lockstep
