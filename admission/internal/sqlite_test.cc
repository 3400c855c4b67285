#include "admission/internal/sqlite.h"

#include <unistd.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_testutil.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace admission {
namespace internal {
namespace {

std::unique_ptr<SqliteDb> TableOfThree(const std::string& name) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/sqlite_", name, "_", getpid());
  unlink(path.c_str());
  absl::StatusOr<std::unique_ptr<SqliteDb>> db = SqliteDb::Open(path, /*create=*/true);
  EXPECT_TRUE(db.ok()) << db.status();
  if (!db.ok()) return nullptr;
  EXPECT_TRUE((*db)
                  ->Exec("CREATE TABLE t(k INTEGER PRIMARY KEY, v INTEGER);"
                         "INSERT INTO t VALUES (1, 10), (2, 20), (3, 30);")
                  .ok());
  return std::move(*db);
}

constexpr char kSelect[] = "SELECT v FROM t WHERE k >= ?1 ORDER BY k";

TEST(SqliteStatementTest, AReleasedStatementIsReusedResetAndWithoutItsBindings) {
  std::unique_ptr<SqliteDb> db = TableOfThree("reuse");
  ASSERT_NE(db, nullptr);
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(SqliteStatement select, db->Prepare(kSelect));
    LOCKSTEP_ASSERT_OK(select.BindInt(1, 2));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(bool row, select.Step());
    ASSERT_TRUE(row);
    EXPECT_EQ(select.ColumnInt(0), 20);
  }  // released after one of two rows
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(SqliteStatement again, db->Prepare(kSelect));
  // Unbound, ?1 is NULL, and k >= NULL holds for no row: the old binding is gone, and the
  // statement starts over rather than going on after the row it had reached.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(bool row, again.Step());
  EXPECT_FALSE(row);
  again.Reset();
  LOCKSTEP_ASSERT_OK(again.BindInt(1, 1));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(row, again.Step());
  ASSERT_TRUE(row);
  EXPECT_EQ(again.ColumnInt(0), 10);
}

TEST(SqliteStatementTest, TwoLiveStatementsOfOneTextAreIndependent) {
  std::unique_ptr<SqliteDb> db = TableOfThree("two");
  ASSERT_NE(db, nullptr);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(SqliteStatement first, db->Prepare(kSelect));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(SqliteStatement second, db->Prepare(kSelect));
  LOCKSTEP_ASSERT_OK(first.BindInt(1, 3));
  LOCKSTEP_ASSERT_OK(second.BindInt(1, 1));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(bool row, first.Step());
  ASSERT_TRUE(row);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(row, second.Step());
  ASSERT_TRUE(row);
  EXPECT_EQ(first.ColumnInt(0), 30);
  EXPECT_EQ(second.ColumnInt(0), 10);
}

TEST(SqliteStatementTest, AReleasedReadDoesNotHoldTheDatabase) {
  std::unique_ptr<SqliteDb> db = TableOfThree("read");
  ASSERT_NE(db, nullptr);
  LOCKSTEP_ASSERT_OK(db->Exec("PRAGMA journal_mode=WAL"));
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(SqliteStatement select, db->Prepare(kSelect));
    LOCKSTEP_ASSERT_OK(select.BindInt(1, 1));
    LOCKSTEP_ASSERT_OK(select.Step().status());  // a read left open, then released
  }
  // A full checkpoint succeeds only when no read on this connection pins the WAL.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(SqliteStatement checkpoint,
                                db->Prepare("PRAGMA wal_checkpoint(TRUNCATE)"));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(bool row, checkpoint.Step());
  ASSERT_TRUE(row);
  EXPECT_EQ(checkpoint.ColumnInt(0), 0) << "the checkpoint was blocked";
}

}  // namespace
}  // namespace internal
}  // namespace admission
}  // namespace lockstep
