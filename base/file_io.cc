#include "base/file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
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

std::string Directory(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes) {
  if (path.empty()) return absl::InvalidArgumentError("the output path is empty");
  std::string temporary = absl::StrCat(path, ".tmp.XXXXXX");
  const int fd = mkstemp(temporary.data());
  if (fd < 0) return OsError(errno, "cannot create a temporary file beside", path);
  const bool written = WriteAll(fd, bytes);
  const int write_error = errno;
  if (!written || fsync(fd) != 0) {
    const int error = written ? errno : write_error;
    close(fd);
    unlink(temporary.c_str());
    return OsError(error, "cannot write", temporary);
  }
  // mkstemp makes the file 0600; give it what a plain create would.
  const mode_t mask = umask(0);
  umask(mask);
  fchmod(fd, 0666 & ~mask);
  if (close(fd) != 0 || rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    unlink(temporary.c_str());
    return OsError(error, "cannot replace", path);
  }
  // Make the rename itself durable.
  const int dir = open(Directory(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    fsync(dir);
    close(dir);
  }
  return absl::OkStatus();
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
