#include "admission/internal/ledger_verify.h"

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "admission/internal/ledger_head.h"
#include "admission/internal/ledger_schema.h"
#include "base/status_macros.h"

namespace lockstep {
namespace admission {
namespace internal {
namespace {

absl::Status Corrupt(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("ledger ", path, " is not intact: ", what));
}

using StepKey = std::pair<int64_t, int>;  // (step, dp_rank)

}  // namespace

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

namespace {

using Contribution = std::tuple<int64_t, int, int32_t, int64_t, int64_t, int64_t>;

// What the events imply, per step: for the derived tables, and to find each step's replay.
struct Implied {
  std::map<StepKey, std::map<int32_t, int64_t>> planned;
  std::map<StepKey, std::vector<TokenRange>> completed;
  std::map<StepKey, int64_t> commits;
  std::map<StepKey, size_t> step_index;  // into the replay's steps
  // (step, dp_rank, batch_index, token_begin, token_end, event_seq)
  std::set<Contribution> contributions;
};

// The file is a ledger of this schema version, exactly, and passes SQLite's integrity check.
absl::Status CheckFormat(SqliteDb& db) {
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
  LOCKSTEP_RETURN_IF_ERROR(VerifySchema(db));
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
  return absl::OkStatus();
}

// Reads the ledger's one identity row into `verified`.
absl::Status ReadIdentity(SqliteDb& db, Verified& verified) {
  LOCKSTEP_ASSIGN_OR_RETURN(SqliteStatement rows,
                            db.Prepare("SELECT ledger_id, dp_rank FROM identity"));
  int count = 0;
  while (true) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, rows.Step());
    if (!row) break;
    ++count;
    verified.ledger_id = rows.ColumnText(0);
    verified.dp_rank = static_cast<int>(rows.ColumnInt(1));
  }
  if (count != 1) return Corrupt(db.path(), absl::StrCat(count, " identity rows, not one"));
  return absl::OkStatus();
}

// Reads the current row of `rows` (the events query) into `e` and its kind's name into `kind`,
// and checks that it is the ledger's next event, of its DP rank and on its chain; moves
// `verified`'s chain and next seq past it (and records the chain at `head_seq`).
absl::Status ReadChainedEvent(SqliteStatement& rows, const std::string& path, int64_t head_seq,
                              Verified& verified, LedgerEvent& e, std::string& kind) {
  e.seq = rows.ColumnInt(0);
  e.step = rows.ColumnInt(1);
  e.dp_rank = static_cast<int>(rows.ColumnInt(2));
  kind = rows.ColumnText(3);
  const std::string ranges = rows.ColumnText(5);
  e.microbatch = rows.ColumnText(4);
  e.detail = rows.ColumnText(6);
  const std::string where = absl::StrCat("event ", e.seq);
  if (e.dp_rank != verified.dp_rank) {
    return Corrupt(path, absl::StrCat(where, " is of DP rank ", e.dp_rank,
                                      "; the ledger is DP rank ", verified.dp_rank, "'s"));
  }
  if (e.seq != verified.next_seq) {
    return Corrupt(path,
                   absl::StrCat("event ", verified.next_seq, " is missing (next is ", e.seq, ")"));
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
  if (e.seq == head_seq) verified.head_chain = chain;
  ++verified.next_seq;
  return absl::OkStatus();
}

// A kCompleted event `e` (`where`) of step `key`: each range planned and counted once, added to
// the step's completed ranges, the contributions and `step`'s replay.
absl::Status ApplyCompleted(const LedgerEvent& e, const StepKey& key, const std::string& where,
                            const std::string& path, Implied& implied, StepReplay& step) {
  for (const TokenRange& r : e.ranges) {
    for (const TokenRange& c : implied.completed[key]) {
      if (c.batch_index == r.batch_index && c.begin < r.end && r.begin < c.end) {
        return Corrupt(path, absl::StrCat("exactly-once violated: ", RangeText(r), " of step ",
                                          e.step, " counted twice (", where, ")"));
      }
    }
    auto p = implied.planned[key].find(r.batch_index);
    if (p == implied.planned[key].end() || r.end > p->second) {
      return Corrupt(path, absl::StrCat(where, ": ", RangeText(r), " is not planned"));
    }
    implied.completed[key].push_back(r);
    implied.contributions.emplace(e.step, e.dp_rank, r.batch_index, r.begin, r.end, e.seq);
    step.completed_tokens += r.end - r.begin;
  }
  step.completed_microbatches.push_back(e.microbatch);
  return absl::OkStatus();
}

// Applies event `e` (of kind name `kind`) to its step's replay in `verified` and to `implied`:
// a step is planned before anything else happens to it, and nothing happens after its commit.
absl::Status ApplyEvent(const LedgerEvent& e, const std::string& kind, const std::string& path,
                        Verified& verified, Implied& implied) {
  const std::string where = absl::StrCat("event ", e.seq);
  const StepKey key{e.step, e.dp_rank};
  auto [it, inserted] = implied.step_index.emplace(key, verified.replay.steps.size());
  if (inserted) {
    if (e.kind != LedgerEventKind::kPlanned) {
      return Corrupt(
          path, absl::StrCat(where, ": step ", e.step, " has ", kind, " before it was planned"));
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
        int64_t& tokens = implied.planned[key][r.batch_index];
        tokens = std::max(tokens, r.end);
      }
      break;
    case LedgerEventKind::kCompleted:
      LOCKSTEP_RETURN_IF_ERROR(ApplyCompleted(e, key, where, path, implied, step));
      break;
    case LedgerEventKind::kStepCommitted:
      step.committed = true;
      implied.commits[key] = e.seq;
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

// Replays every event, in seq order, into `verified` (chain, next seq, replay) and `implied`.
absl::Status ReplayEvents(SqliteDb& db, int64_t head_seq, Verified& verified, Implied& implied) {
  LOCKSTEP_ASSIGN_OR_RETURN(
      SqliteStatement rows,
      db.Prepare("SELECT seq, step, dp_rank, kind, microbatch, ranges, detail, chain "
                 "FROM events ORDER BY seq"));
  while (true) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, rows.Step());
    if (!row) break;
    LedgerEvent e;
    std::string kind;
    LOCKSTEP_RETURN_IF_ERROR(ReadChainedEvent(rows, db.path(), head_seq, verified, e, kind));
    LOCKSTEP_RETURN_IF_ERROR(ApplyEvent(e, kind, db.path(), verified, implied));
    verified.replay.events.push_back(std::move(e));
  }
  return absl::OkStatus();
}

// Each step's planned tokens, completed and missing ranges; a committed step misses none.
absl::Status FinishSteps(const std::string& path, Implied& implied, Verified& verified) {
  for (StepReplay& step : verified.replay.steps) {
    const StepKey key{step.step, step.dp_rank};
    for (const auto& [index, tokens] : implied.planned[key]) step.planned_tokens += tokens;
    step.completed = Merged(implied.completed[key]);
    step.missing = Missing(implied.planned[key], step.completed);
    if (step.committed && !step.missing.empty()) {
      return Corrupt(path,
                     absl::StrCat("exactly-once violated: step ", step.step, " committed with ",
                                  RangeText(step.missing[0]), " missing"));
    }
  }
  return absl::OkStatus();
}

// The derived tables (planned, contributions, commits) hold exactly what the events imply.
absl::Status CheckDerivedTables(SqliteDb& db, const Implied& implied) {
  const std::string& path = db.path();
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
    for (const auto& [key, sequences] : implied.planned) {
      if (!sequences.empty()) expected[key] = sequences;
    }
    if (table != expected) return Corrupt(path, "table planned disagrees with the events");
  }
  {
    std::set<Contribution> table;
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
    if (table != implied.contributions) {
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
    if (table != implied.commits) return Corrupt(path, "table commits disagrees with the events");
  }
  return absl::OkStatus();
}

// LoadAndVerify's checks, each statement its own read of the file unless the caller holds one
// transaction around them.
absl::StatusOr<Verified> LoadAndVerifyOneSnapshot(SqliteDb& db, int64_t head_seq) {
  LOCKSTEP_RETURN_IF_ERROR(CheckFormat(db));
  Verified verified;
  LOCKSTEP_RETURN_IF_ERROR(ReadIdentity(db, verified));
  verified.chain = GenesisChain(verified.ledger_id, verified.dp_rank);
  if (head_seq == 0) verified.head_chain = verified.chain;
  Implied implied;
  LOCKSTEP_RETURN_IF_ERROR(ReplayEvents(db, head_seq, verified, implied));
  LOCKSTEP_RETURN_IF_ERROR(FinishSteps(db.path(), implied, verified));
  LOCKSTEP_RETURN_IF_ERROR(CheckDerivedTables(db, implied));
  return verified;
}

}  // namespace

// Note [One snapshot of a live ledger]: a reader beside an active writer (the ledger tool on a
// running job) must verify one state of the file. Each statement outside a transaction reads the
// file as it is when that statement starts, so the events could be read before a commit and the
// tables derived from them after it, and the two disagree: a live, sound ledger reported as
// DATA_LOSS. One read transaction around every check reads one snapshot: every transaction
// committed before its first read and none after. The head is read before it (ledger_open.cc), so
// the snapshot holds at least the head's event.
absl::StatusOr<Verified> LoadAndVerify(SqliteDb& db, int64_t head_seq) {
  LOCKSTEP_RETURN_IF_ERROR(db.Exec("BEGIN"));
  absl::StatusOr<Verified> verified = LoadAndVerifyOneSnapshot(db, head_seq);
  // A read transaction writes nothing: ending it is only to let the connection write after.
  const absl::Status ended = db.Exec(verified.ok() ? "COMMIT" : "ROLLBACK");
  if (verified.ok() && !ended.ok()) return ended;
  return verified;
}

}  // namespace internal
}  // namespace admission
}  // namespace lockstep
