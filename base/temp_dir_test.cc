#include "base/temp_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

bool Exists(const std::string& path) {
  struct stat info;
  return lstat(path.c_str(), &info) == 0;
}

// A fresh, unique directory under $TEST_TMPDIR, removed with everything in it (a nested
// directory, a file, a link whose target survives) when it goes out of scope.
TEST(TempDirTest, IsUniqueUnderTheTestsTemporaryDirectoryAndRemovedWithItsContents) {
  const std::string outside = std::string(std::getenv("TEST_TMPDIR")) + "/outside.txt";
  std::ofstream(outside) << "kept";
  std::string path;
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(TempDir dir, TempDir::Make("unit"));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(TempDir other, TempDir::Make("unit"));
    path = dir.path();
    EXPECT_NE(path, other.path());
    EXPECT_THAT(path, StartsWith(std::string(std::getenv("TEST_TMPDIR")) + "/lockstep_unit_"));
    ASSERT_EQ(mkdir((path + "/nested").c_str(), 0755), 0);
    std::ofstream(path + "/nested/file") << "x";
    ASSERT_EQ(symlink(outside.c_str(), (path + "/link").c_str()), 0);
    TempDir moved = std::move(dir);
    EXPECT_EQ(moved.path(), path);
    EXPECT_TRUE(dir.path().empty());
  }
  EXPECT_FALSE(Exists(path));
  EXPECT_TRUE(Exists(outside)) << "the link's target was removed through the link";
}

// A released directory is the reader's: its path is returned, and the TempDir removes nothing.
TEST(TempDirTest, AReleasedDirectoryIsKept) {
  std::string kept;
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(TempDir dir, TempDir::Make("released"));
    const std::string path = dir.path();
    std::ofstream(path + "/evidence.json") << "{}";
    kept = dir.Release();
    EXPECT_EQ(kept, path);
    EXPECT_TRUE(dir.path().empty());
  }
  struct stat st;
  EXPECT_EQ(stat((kept + "/evidence.json").c_str(), &st), 0) << kept << " was removed";
  ASSERT_EQ(unlink((kept + "/evidence.json").c_str()), 0);
  ASSERT_EQ(rmdir(kept.c_str()), 0);
}

TEST(TempDirTest, AnImpossibleRootIsNamed) {
  setenv("TEST_TMPDIR", "/nonexistent-root-for-temp-dirs", 1);
  const absl::Status s = TempDir::Make("unit").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("/nonexistent-root-for-temp-dirs/lockstep_unit_"));
}

}  // namespace
}  // namespace lockstep
