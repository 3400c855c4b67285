#include "base/file_io.h"

#include <dirent.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <string>

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
