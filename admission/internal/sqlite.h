// admission/internal/sqlite.h
//
// A thin owner of a SQLite connection and its prepared statements for the ledger: every SQLite
// result code becomes an absl::Status naming the statement and the database path (corruption
// codes -> kDataLoss, busy/locked -> kUnavailable, full disk -> kResourceExhausted, misuse and
// the rest -> kInternal; constraint violations -> kFailedPrecondition with SQLite's message,
// which carries the ledger triggers' RAISE text).
//
// Thread-safety: none; one thread uses a SqliteDb and its statements at a time.

#ifndef LOCKSTEP_ADMISSION_INTERNAL_SQLITE_H_
#define LOCKSTEP_ADMISSION_INTERNAL_SQLITE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct sqlite3;
struct sqlite3_stmt;

namespace lockstep {
namespace admission {
namespace internal {

class SqliteStatement;

class SqliteDb {
 public:
  // Opens `path` read-write; `create` also creates a missing file. kNotFound for a missing file
  // when not creating. Closing the connection neither checkpoints nor removes the WAL until
  // SetCheckpointOnClose(true): a file opened to be verified is left exactly as found.
  static absl::StatusOr<std::unique_ptr<SqliteDb>> Open(const std::string& path, bool create);

  // Whether closing the connection checkpoints the WAL into the file and removes it (SQLite's
  // default, and what a writer of a verified ledger wants).
  void SetCheckpointOnClose(bool checkpoint);

  ~SqliteDb();
  SqliteDb(const SqliteDb&) = delete;
  SqliteDb& operator=(const SqliteDb&) = delete;

  // Runs one or more statements without results.
  absl::Status Exec(absl::string_view sql);

  // Prepares one statement. A statement of the same text prepared before and released is reused
  // (reset, bindings cleared) instead of compiled again: the ledger runs the same few statements
  // for every event. Every statement must be released before its SqliteDb is destroyed.
  absl::StatusOr<SqliteStatement> Prepare(absl::string_view sql);

  // The single integer a query such as "PRAGMA user_version" returns.
  absl::StatusOr<int64_t> QueryInt(absl::string_view sql);

  // The status for SQLite result code `rc` of `what`, with the connection's message.
  absl::Status Error(int rc, absl::string_view what) const;

  const std::string& path() const { return path_; }

 private:
  SqliteDb(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  friend class SqliteStatement;
  // Takes back a released statement (reset and unbound) of text `sql` for reuse, or finalizes it
  // if one of that text is already kept.
  void Release(std::string sql, sqlite3_stmt* stmt);

  sqlite3* db_;
  std::string path_;
  // Released statements by their text, reset and ready for reuse.
  std::unordered_map<std::string, sqlite3_stmt*> idle_;
};

// One prepared statement; Bind* by 1-based index, Step, column readers, Reset for reuse.
class SqliteStatement {
 public:
  SqliteStatement(SqliteStatement&& other) noexcept;
  SqliteStatement& operator=(SqliteStatement&&) = delete;
  SqliteStatement(const SqliteStatement&) = delete;
  ~SqliteStatement();

  absl::Status BindInt(int index, int64_t value);
  absl::Status BindText(int index, absl::string_view value);
  absl::Status BindBlob(int index, absl::string_view value);
  absl::Status BindNull(int index);

  // True when a row is ready, false when the statement is done.
  absl::StatusOr<bool> Step();
  // Step() that must finish without a row (INSERT, UPDATE).
  absl::Status Run();
  // Clears bindings and rewinds, for the next execution.
  void Reset();

  int64_t ColumnInt(int column) const;
  std::string ColumnText(int column) const;
  std::string ColumnBlob(int column) const;
  bool ColumnIsNull(int column) const;

 private:
  friend class SqliteDb;
  SqliteStatement(SqliteDb* db, sqlite3_stmt* stmt, std::string sql)
      : db_(db), stmt_(stmt), sql_(std::move(sql)) {}

  SqliteDb* db_;
  sqlite3_stmt* stmt_;
  std::string sql_;  // the whole text (the key it is kept under for reuse)
};

}  // namespace internal
}  // namespace admission
}  // namespace lockstep

#endif  // LOCKSTEP_ADMISSION_INTERNAL_SQLITE_H_
