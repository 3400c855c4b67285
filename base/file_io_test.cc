#include "base/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"

#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int FilesIn(const std::string& dir) {
  int count = 0;
  DIR* d = opendir(dir.c_str());
  while (const dirent* e = readdir(d)) count += e->d_name[0] != '.';
  closedir(d);
  return count;
}

TEST(WriteFileAtomicallyTest, ReplacesTheFileAndLeavesNoTemporary) {
  const std::string dir = testing::TempDir() + "/atomic";
  mkdir(dir.c_str(), 0755);
  const std::string path = dir + "/out.bin";
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(path, "first"));
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(path, std::string("second\0x", 8)));
  EXPECT_EQ(Read(path), std::string("second\0x", 8));
  EXPECT_EQ(FilesIn(dir), 1);
}

TEST(WriteFileAtomicallyTest, AFailureNamesThePathAndChangesNothing) {
  const absl::Status missing = WriteFileAtomically("/nonexistent-dir/out.bin", "x");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("/nonexistent-dir/out.bin"));
  EXPECT_EQ(WriteFileAtomically("", "x").code(), absl::StatusCode::kInvalidArgument);
}

// The new file's mode is what a plain create gives (0666 less the umask), and writing never
// touches the process's umask: a file another thread creates meanwhile gets the umask's mode too
// (a umask(0)/umask(mask) toggle inside the write let such a file be created world-writable).
TEST(WriteFileAtomicallyTest, ModeFollowsTheUmaskWhichNeverChanges) {
  const mode_t previous = umask(027);
  const std::string dir = testing::TempDir() + "/modes";
  mkdir(dir.c_str(), 0755);
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0};
  std::thread creator([&] {
    for (int i = 0; !stop.load(); ++i) {
      const std::string path = absl::StrCat(dir, "/plain", i % 8);
      unlink(path.c_str());
      const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0666);
      struct stat info;
      if (fd >= 0 && fstat(fd, &info) == 0 && (info.st_mode & 0777) != 0640) ++wrong;
      if (fd >= 0) close(fd);
    }
  });
  for (int i = 0; i < 300; ++i) {
    LOCKSTEP_ASSERT_OK(WriteFileAtomically(dir + "/atomic.bin", "x"));
  }
  stop = true;
  creator.join();
  struct stat info;
  ASSERT_EQ(stat((dir + "/atomic.bin").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0640u);
  EXPECT_EQ(wrong.load(), 0) << "files created during the writes got another mode than the umask's";
  EXPECT_EQ(umask(previous), 027u);
}

TEST(SyncPathTest, SyncsFilesAndDirectoriesAndNamesWhatIsMissing) {
  const std::string path = testing::TempDir() + "/synced.bin";
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(path, "x"));
  LOCKSTEP_EXPECT_OK(SyncPath(path));
  LOCKSTEP_EXPECT_OK(SyncParentDirectory(path));
  const absl::Status missing = SyncPath(testing::TempDir() + "/no-such-dir/f");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("no-such-dir"));
  EXPECT_EQ(ParentDirectory("a/b/c"), "a/b");
  EXPECT_EQ(ParentDirectory("/c"), "/");
  EXPECT_EQ(ParentDirectory("c"), ".");
}

TEST(MappedFileTest, MapsTheBytesAndRefusesWhatIsNotAFile) {
  const std::string path = testing::TempDir() + "/mapped.bin";
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(path, std::string("a\0b", 3)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<const MappedFile> file, MappedFile::Open(path));
  EXPECT_EQ(file->bytes(), absl::string_view("a\0b", 3));
  const std::string empty = testing::TempDir() + "/empty.bin";
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(empty, ""));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<const MappedFile> none, MappedFile::Open(empty));
  EXPECT_TRUE(none->bytes().empty());
  EXPECT_EQ(MappedFile::Open(testing::TempDir() + "/no-such-file").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(MappedFile::Open(testing::TempDir()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lockstep
