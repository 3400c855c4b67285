#include "base/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
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
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    count += name != "." && name != "..";  // temporaries are dotfiles: count them
  }
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

// An output that is a device or a FIFO must keep being one
// (replacing /dev/null with a regular file breaks it for every later process on the machine).
TEST(WriteFileAtomicallyTest, DevicesAndFifosAreWrittenDirectlyNeverReplaced) {
  LOCKSTEP_ASSERT_OK(WriteFileAtomically("/dev/null", "evidence"));
  struct stat info;
  ASSERT_EQ(stat("/dev/null", &info), 0);
  EXPECT_TRUE(S_ISCHR(info.st_mode));
  const absl::Status full = WriteFileAtomically("/dev/full", "evidence");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_THAT(full.message(), HasSubstr("/dev/full"));

  const std::string fifo = testing::TempDir() + "/out.fifo";
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // No reader: refused at once, not a hang.
  const absl::Status no_reader = WriteFileAtomically(fifo, "x");
  EXPECT_EQ(no_reader.code(), absl::StatusCode::kFailedPrecondition) << no_reader;
  LOCKSTEP_EXPECT_OK(CheckWritable(fifo));  // a reader may come later
  // A reader that never blocks: opened without waiting for a writer, then read to the end.
  const int reading = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reading, 0);
  LOCKSTEP_EXPECT_OK(WriteFileAtomically(fifo, "through the pipe"));
  char received[64] = {};
  EXPECT_EQ(read(reading, received, sizeof(received)), 16);
  close(reading);
  EXPECT_EQ(std::string(received), "through the pipe");
  ASSERT_EQ(lstat(fifo.c_str(), &info), 0);
  EXPECT_TRUE(S_ISFIFO(info.st_mode));
}

// /dev/stdout, /dev/fd/N and /proc/self/fd/N are the caller's streams: a pipe is written (a
// link that reads as "pipe:[N]" once made writes fail), a regular file the shell opened is
// appended to in place, never renamed over (the descriptor would stay on the old file).
TEST(WriteFileAtomicallyTest, DescriptorPathsAreWrittenThroughTheirDescriptor) {
  int ends[2];
  ASSERT_EQ(pipe(ends), 0);
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(absl::StrCat("/proc/self/fd/", ends[1]), "piped"));
  LOCKSTEP_EXPECT_OK(CheckWritable(absl::StrCat("/dev/fd/", ends[1])));
  char buffer[16] = {};
  EXPECT_EQ(read(ends[0], buffer, sizeof(buffer)), 5);
  EXPECT_EQ(std::string(buffer), "piped");
  // A reader that is gone: an error (EPIPE), not a process killed by SIGPIPE.
  close(ends[0]);
  const absl::Status broken = WriteFileAtomically(absl::StrCat("/dev/fd/", ends[1]), "x");
  EXPECT_FALSE(broken.ok());
  EXPECT_THAT(broken.message(), HasSubstr("Broken pipe"));
  close(ends[1]);

  const std::string log = testing::TempDir() + "/appended.log";
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(log, "first "));
  const int appending = open(log.c_str(), O_WRONLY | O_APPEND);
  ASSERT_GE(appending, 0);
  struct stat before, after;
  ASSERT_EQ(fstat(appending, &before), 0);
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(absl::StrCat("/dev/fd/", appending), "second"));
  ASSERT_EQ(stat(log.c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino) << "the file was replaced, not written";
  EXPECT_EQ(Read(log), "first second");
  close(appending);
}

// Replacing a file keeps who may read it.
TEST(WriteFileAtomicallyTest, AReplacedFileKeepsItsPermissions) {
  const std::string path = testing::TempDir() + "/private.json";
  unlink(path.c_str());
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(path, "secret"));
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(path, "still secret"));
  struct stat info;
  ASSERT_EQ(stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0600u);
  EXPECT_EQ(Read(path), "still secret");
}

// Note [Outputs through links]: a link at the output's name is refused and left as it was, and
// its target is untouched, whether the target exists, dangles or loops.
TEST(WriteFileAtomicallyTest, ALinkIsRefusedAndItsTargetUntouched) {
  const std::string dir = testing::TempDir() + "/links";
  mkdir(dir.c_str(), 0755);
  const std::string target = dir + "/target.json", link = dir + "/link.json";
  unlink(link.c_str());
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(target, "old"));
  ASSERT_EQ(symlink("target.json", link.c_str()), 0);  // relative to the link's directory
  const absl::Status refused = WriteFileAtomically(link, "new");
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("symbolic link"));
  EXPECT_EQ(CheckWritable(link).code(), absl::StatusCode::kInvalidArgument);
  struct stat info;
  ASSERT_EQ(lstat(link.c_str(), &info), 0);
  EXPECT_TRUE(S_ISLNK(info.st_mode));
  EXPECT_EQ(Read(target), "old");
  // A dangling link creates nothing.
  const std::string dangling = dir + "/dangling.json";
  unlink(dangling.c_str());
  unlink((dir + "/created.json").c_str());
  ASSERT_EQ(symlink("created.json", dangling.c_str()), 0);
  EXPECT_EQ(WriteFileAtomically(dangling, "made").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(access((dir + "/created.json").c_str(), F_OK), 0) << "the link was followed";
  const std::string a = dir + "/loop-a", b = dir + "/loop-b";
  unlink(a.c_str());
  unlink(b.c_str());
  ASSERT_EQ(symlink("loop-b", a.c_str()), 0);
  ASSERT_EQ(symlink("loop-a", b.c_str()), 0);
  EXPECT_EQ(WriteFileAtomically(a, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckWritable(a).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteFileAtomically(dir, "x").code(), absl::StatusCode::kInvalidArgument);
  // A link whose target only looks like a descriptor's path reaches a file: refused.
  for (const std::string& sly : {absl::StrCat("/proc/self/fd/../cwd/", target),
                                 std::string("/proc/1/fd/1"), std::string("/dev/fd/../null")}) {
    const std::string planted = dir + "/sly";
    unlink(planted.c_str());
    ASSERT_EQ(symlink(sly.c_str(), planted.c_str()), 0);
    EXPECT_EQ(WriteFileAtomically(planted, "new").code(), absl::StatusCode::kInvalidArgument)
        << sly;
  }
  EXPECT_EQ(Read(target), "old");
  // A link to the process's own stream is the caller's: written.
  int ends[2];
  ASSERT_EQ(pipe(ends), 0);
  const std::string stream = dir + "/stream";
  unlink(stream.c_str());
  ASSERT_EQ(symlink(absl::StrCat("/proc/self/fd/", ends[1]).c_str(), stream.c_str()), 0);
  LOCKSTEP_EXPECT_OK(WriteFileAtomically(stream, "piped"));
  char buffer[8] = {};
  EXPECT_EQ(read(ends[0], buffer, sizeof(buffer)), 5);
  close(ends[0]);
  close(ends[1]);
}

TEST(WriteFileAtomicallyTest, ANameOfNameMaxBytesIsWritable) {
  const std::string dir = testing::TempDir() + "/long";
  mkdir(dir.c_str(), 0755);
  const std::string path = dir + "/" + std::string(255, 'n');
  LOCKSTEP_ASSERT_OK(CheckWritable(path));
  EXPECT_EQ(FilesIn(dir), 0) << "CheckWritable created something";
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(path, "long"));
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(path, "longer"));
  EXPECT_EQ(Read(path), "longer");
  EXPECT_EQ(FilesIn(dir), 1);
}

TEST(WriteFileAtomicallyTest, CheckWritableFindsAnUnwritableTargetCreatingNothing) {
  const absl::Status missing = CheckWritable("/nonexistent-dir/out.json");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  const std::string dir = testing::TempDir() + "/check";
  mkdir(dir.c_str(), 0755);
  LOCKSTEP_EXPECT_OK(CheckWritable(dir + "/out.json"));
  EXPECT_EQ(FilesIn(dir), 0);
  LOCKSTEP_EXPECT_OK(CheckWritable("/dev/null"));
  EXPECT_EQ(CheckWritable(dir).code(), absl::StatusCode::kInvalidArgument);
}

TEST(MappedFileTest, FifosDevicesAndProcFilesAreRefusedWithoutBlocking) {
  const std::string fifo = testing::TempDir() + "/in.fifo";
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {fifo, std::string("/dev/zero"), std::string("/proc/self/status"),
                                  std::string("/sys/kernel/mm/transparent_hugepage/enabled")}) {
    struct stat info;
    if (stat(path.c_str(), &info) != 0) continue;  // not every machine has every /sys file
    const absl::Status mapped = MappedFile::Open(path).status();
    EXPECT_EQ(mapped.code(), absl::StatusCode::kInvalidArgument) << path << ": " << mapped;
    EXPECT_THAT(mapped.message(), HasSubstr("not a regular file")) << path;
    const absl::Status read = ReadFileToString(path, 1 << 20).status();
    EXPECT_EQ(read.code(), absl::StatusCode::kInvalidArgument) << path << ": " << read;
  }
}

// Note [Reading a shrinking file]: touching the pages past the new end must not kill the reader.
TEST(MappedFileTest, AFileTruncatedWhileMappedReadsZerosAndIsReported) {
  const std::string path = testing::TempDir() + "/shrinking.bin";
  const size_t size = 1 << 20;
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(path, std::string(size, '\x7f')));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<const MappedFile> file, MappedFile::Open(path));
  LOCKSTEP_EXPECT_OK(file->CheckUnchanged());
  ASSERT_EQ(truncate(path.c_str(), 4096), 0);
  uint64_t sum = 0;
  for (char c : file->bytes()) sum += static_cast<uint8_t>(c);
  EXPECT_EQ(sum, 4096u * 0x7f) << "the pages past the new end read as zeros";
  const absl::Status changed = file->CheckUnchanged();
  EXPECT_EQ(changed.code(), absl::StatusCode::kAborted) << changed;
  EXPECT_THAT(changed.message(), HasSubstr(path));
  EXPECT_THAT(changed.message(), HasSubstr("changed while it was being read"));
  EXPECT_THAT(changed.message(), HasSubstr("pages past its new end were read"));
  // Rewritten in place to the same size (`cp` over it): still reported.
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(path, std::string(size, 'a')));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<const MappedFile> again, MappedFile::Open(path));
  {
    const int fd = open(path.c_str(), O_WRONLY | O_TRUNC);
    ASSERT_GE(fd, 0);
    const std::string bytes(size, 'b');
    ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    // The same size; the time may tick within the clock's resolution, so set it apart.
    const timespec times[2] = {{0, UTIME_OMIT}, {1, 0}};
    ASSERT_EQ(futimens(fd, times), 0);
    close(fd);
  }
  EXPECT_EQ(again->CheckUnchanged().code(), absl::StatusCode::kAborted);
}

// A SIGBUS outside any mapping still gets the process's own disposition.
TEST(MappedFileTest, ASigbusOutsideAMappingStillEndsTheProcess) {
  EXPECT_EXIT(
      {
        const std::string path = testing::TempDir() + "/bus.bin";
        if (!WriteFileAtomically(path, std::string(8192, 'x')).ok()) _exit(1);
        std::shared_ptr<const MappedFile> kept = *MappedFile::Open(path);  // installs the handler
        // A mapping of our own, not a MappedFile, past its file's end.
        const int fd = open(path.c_str(), O_RDONLY);
        auto* raw =
            static_cast<volatile char*>(mmap(nullptr, 4 * 8192, PROT_READ, MAP_SHARED, fd, 0));
        std::printf("%d\n", raw[3 * 8192]);
        _exit(0);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

TEST(ReadFileToStringTest, ReadsAndBoundsTheSize) {
  const std::string path = testing::TempDir() + "/small.txt";
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(path, "twelve bytes"));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::string text, ReadFileToString(path, 12));
  EXPECT_EQ(text, "twelve bytes");
  const absl::Status big = ReadFileToString(path, 11).status();
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.message(), HasSubstr("12 bytes"));
  EXPECT_THAT(big.message(), HasSubstr("11"));
}

}  // namespace
}  // namespace lockstep
