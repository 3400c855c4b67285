#include "admission/internal/sqlite.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace admission {
namespace internal {
namespace {

absl::StatusCode CodeOf(int rc) {
  switch (rc & 0xff) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
    case SQLITE_FORMAT:
      return absl::StatusCode::kDataLoss;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::StatusCode::kUnavailable;
    case SQLITE_FULL:
    case SQLITE_NOMEM:
      return absl::StatusCode::kResourceExhausted;
    case SQLITE_CONSTRAINT:
      return absl::StatusCode::kFailedPrecondition;
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_READONLY:
      return absl::StatusCode::kPermissionDenied;
    default:
      return absl::StatusCode::kInternal;
  }
}

// A statement's text as errors show it.
absl::string_view Shown(absl::string_view sql) { return sql.substr(0, 60); }

}  // namespace

absl::StatusOr<std::unique_ptr<SqliteDb>> SqliteDb::Open(const std::string& path, bool create) {
  struct stat info;
  if (!create && stat(path.c_str(), &info) != 0) {
    return absl::NotFoundError(absl::StrCat("ledger ", path, " does not exist"));
  }
  sqlite3* db = nullptr;
  const int flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0) |
                    SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_PRIVATECACHE;
  const int rc = sqlite3_open_v2(path.c_str(), &db, flags, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status status(CodeOf(rc), absl::StrCat("opening ledger ", path, ": ",
                                                 db != nullptr ? sqlite3_errmsg(db) : "no memory"));
    sqlite3_close(db);
    return status;
  }
  sqlite3_extended_result_codes(db, 1);
  // A reader beside a live writer meets the file locked for moments (the writer restarting the
  // WAL, a checkpoint): it waits them out instead of failing (Note [One snapshot of a live
  // ledger]).
  sqlite3_busy_timeout(db, 2000);
  // Note [The ledger's head record]: nothing is checkpointed or deleted at close until the
  // ledger has verified the file (SetCheckpointOnClose).
  sqlite3_db_config(db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);
  return std::unique_ptr<SqliteDb>(new SqliteDb(db, path));
}

SqliteDb::~SqliteDb() {
  for (auto& [sql, stmt] : idle_) sqlite3_finalize(stmt);
  sqlite3_close(db_);
}

void SqliteDb::SetCheckpointOnClose(bool checkpoint) {
  sqlite3_db_config(db_, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, checkpoint ? 0 : 1, nullptr);
}

void SqliteDb::Release(std::string sql, sqlite3_stmt* stmt) {
  if (!idle_.emplace(std::move(sql), stmt).second) sqlite3_finalize(stmt);
}

absl::Status SqliteDb::Error(int rc, absl::string_view what) const {
  return absl::Status(CodeOf(rc),
                      absl::StrCat("ledger ", path_, ": ", what, ": ", sqlite3_errmsg(db_)));
}

absl::Status SqliteDb::Exec(absl::string_view sql) {
  const std::string text(sql);
  const int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return Error(rc, absl::StrCat("running '", Shown(sql), "'"));
  return absl::OkStatus();
}

absl::StatusOr<SqliteStatement> SqliteDb::Prepare(absl::string_view sql) {
  std::string text(sql);
  if (auto kept = idle_.find(text); kept != idle_.end()) {
    sqlite3_stmt* stmt = kept->second;
    idle_.erase(kept);
    return SqliteStatement(this, stmt, std::move(text));
  }
  sqlite3_stmt* stmt = nullptr;
  const int rc = sqlite3_prepare_v3(db_, text.data(), static_cast<int>(text.size()),
                                    SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
  if (rc != SQLITE_OK) return Error(rc, absl::StrCat("preparing '", Shown(sql), "'"));
  return SqliteStatement(this, stmt, std::move(text));
}

absl::StatusOr<int64_t> SqliteDb::QueryInt(absl::string_view sql) {
  absl::StatusOr<SqliteStatement> statement = Prepare(sql);
  if (!statement.ok()) return statement.status();
  absl::StatusOr<bool> row = statement->Step();
  if (!row.ok()) return row.status();
  if (!*row) {
    return absl::InternalError(absl::StrCat("ledger ", path_, ": '", sql, "' returned no row"));
  }
  return statement->ColumnInt(0);
}

SqliteStatement::SqliteStatement(SqliteStatement&& other) noexcept
    : db_(other.db_), stmt_(other.stmt_), sql_(std::move(other.sql_)) {
  other.stmt_ = nullptr;
}

SqliteStatement::~SqliteStatement() {
  if (stmt_ == nullptr) return;
  Reset();  // also ends a read it left open, so checkpoints are not held back
  db_->Release(std::move(sql_), stmt_);
}

absl::Status SqliteStatement::BindInt(int index, int64_t value) {
  const int rc = sqlite3_bind_int64(stmt_, index, value);
  if (rc != SQLITE_OK) return db_->Error(rc, absl::StrCat("binding '", Shown(sql_), "'"));
  return absl::OkStatus();
}

absl::Status SqliteStatement::BindText(int index, absl::string_view value) {
  const int rc =
      sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
  if (rc != SQLITE_OK) return db_->Error(rc, absl::StrCat("binding '", Shown(sql_), "'"));
  return absl::OkStatus();
}

absl::Status SqliteStatement::BindBlob(int index, absl::string_view value) {
  const int rc = sqlite3_bind_blob64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT);
  if (rc != SQLITE_OK) return db_->Error(rc, absl::StrCat("binding '", Shown(sql_), "'"));
  return absl::OkStatus();
}

absl::Status SqliteStatement::BindNull(int index) {
  const int rc = sqlite3_bind_null(stmt_, index);
  if (rc != SQLITE_OK) return db_->Error(rc, absl::StrCat("binding '", Shown(sql_), "'"));
  return absl::OkStatus();
}

absl::StatusOr<bool> SqliteStatement::Step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  absl::Status status = db_->Error(rc, absl::StrCat("running '", Shown(sql_), "'"));
  sqlite3_reset(stmt_);
  return status;
}

absl::Status SqliteStatement::Run() {
  absl::StatusOr<bool> row = Step();
  if (!row.ok()) return row.status();
  if (*row) return absl::InternalError(absl::StrCat("'", Shown(sql_), "' returned a row"));
  return absl::OkStatus();
}

void SqliteStatement::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

int64_t SqliteStatement::ColumnInt(int column) const { return sqlite3_column_int64(stmt_, column); }

std::string SqliteStatement::ColumnText(int column) const {
  const unsigned char* text = sqlite3_column_text(stmt_, column);
  const int size = sqlite3_column_bytes(stmt_, column);
  return text == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(text), size);
}

std::string SqliteStatement::ColumnBlob(int column) const {
  const void* blob = sqlite3_column_blob(stmt_, column);
  const int size = sqlite3_column_bytes(stmt_, column);
  return blob == nullptr ? std::string() : std::string(static_cast<const char*>(blob), size);
}

bool SqliteStatement::ColumnIsNull(int column) const {
  return sqlite3_column_type(stmt_, column) == SQLITE_NULL;
}

}  // namespace internal
}  // namespace admission
}  // namespace lockstep
