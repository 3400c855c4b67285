#include "base/file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/posix_io.h"

namespace lockstep {
namespace {

absl::Status OsError(int error, absl::string_view what, const std::string& path) {
  const std::string message = absl::StrCat(what, " '", path, "': ", std::strerror(error));
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case EISDIR:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

// Creates a new file beside `path` for writing, with mode 0666 (the umask applies, as to any
// create), under a name no other writer uses: O_EXCL, with a per-process counter and a random
// part, retried on a collision.
absl::StatusOr<std::pair<int, std::string>> CreateTemporaryBeside(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  std::random_device random;
  for (int tries = 0; tries < 100; ++tries) {
    const std::string temporary =
        absl::StrCat(path, ".tmp.", getpid(), ".", counter.fetch_add(1), ".", random() % 1000000);
    const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) return std::make_pair(fd, temporary);
    if (errno != EEXIST) return OsError(errno, "cannot create a temporary file beside", path);
  }
  return absl::InternalError(
      absl::StrCat("cannot create a temporary file beside '", path, "': every name was taken"));
}

}  // namespace

std::string ParentDirectory(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

absl::Status SyncPath(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return OsError(errno, "cannot open", path);
  const int rc = fsync(fd);
  const int error = errno;
  close(fd);
  if (rc != 0) return OsError(error, "cannot fsync", path);
  return absl::OkStatus();
}

absl::Status SyncParentDirectory(const std::string& path) {
  return SyncPath(ParentDirectory(path));
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes) {
  if (path.empty()) return absl::InvalidArgumentError("the output path is empty");
  absl::StatusOr<std::pair<int, std::string>> created = CreateTemporaryBeside(path);
  if (!created.ok()) return created.status();
  const auto [fd, temporary] = *created;
  const bool written = WriteAll(fd, bytes);
  const int write_error = errno;
  if (!written || fsync(fd) != 0) {
    const int error = written ? errno : write_error;
    close(fd);
    unlink(temporary.c_str());
    return OsError(error, "cannot write", temporary);
  }
  if (close(fd) != 0 || rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    unlink(temporary.c_str());
    return OsError(error, "cannot replace", path);
  }
  // Make the rename itself durable.
  return SyncParentDirectory(path);
}

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return OsError(errno, "cannot open", path);
  struct stat info;
  if (fstat(fd, &info) != 0) {
    const int error = errno;
    close(fd);
    return OsError(error, "cannot stat", path);
  }
  if (S_ISDIR(info.st_mode)) {
    close(fd);
    return OsError(EISDIR, "cannot map", path);
  }
  const size_t size = static_cast<size_t>(info.st_size);
  void* data = nullptr;
  if (size > 0) {
    data = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
      const int error = errno;
      close(fd);
      return OsError(error, "cannot map", path);
    }
  }
  close(fd);  // the mapping keeps the file
  return std::shared_ptr<const MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(data_, size_);
}

}  // namespace lockstep
