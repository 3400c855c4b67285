#include "base/file_io.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/posix_io.h"

namespace lockstep {
namespace {

absl::Status OsError(int error, absl::string_view what, const std::string& path) {
  const std::string message = absl::StrCat(what, " '", path, "': ", std::strerror(error));
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case EISDIR:
    case ELOOP:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(message);
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      return absl::ResourceExhaustedError(message);
    case ENXIO:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

// What a file of mode `mode` is, for messages.
const char* KindOf(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "of an unknown kind";
}

// ---------------------------------------------------------------------------------------------
// Writing.

// Where a write to `path` goes: the final target after following symbolic links, and its kind.
struct Target {
  std::string path;
  bool exists = false;
  mode_t mode = 0;
  uid_t owner = 0;
  gid_t group = 0;
  // Written through an open of `path` itself, never replaced: a character device, a FIFO, or one
  // of this process's open descriptors named by path (/dev/stdout, /dev/fd/N, /proc/self/fd/N).
  bool direct = false;
};

// Whether `path` names an open descriptor's file (/dev/stdout, /dev/stderr, /dev/fd/N,
// /proc/<pid>/fd/N): whatever that file is (a pipe, a terminal, a regular file the shell opened
// with > or >>), it is the caller's stream, so it is appended to, never replaced (a rename would
// leave the descriptor on the old file).
bool NamesADescriptor(absl::string_view path) {
  return path == "/dev/stdout" || path == "/dev/stderr" || absl::StartsWith(path, "/dev/fd/") ||
         (absl::StartsWith(path, "/proc/") && absl::StrContains(path, "/fd/"));
}

// Whether a link's target names one of this process's own streams exactly: /dev/stdout,
// /dev/stderr, /dev/fd/N or /proc/self/fd/N, with nothing after N. A looser test would let a
// planted link reach any file through "/proc/self/fd/../cwd/..." or another process's
// descriptors.
bool NamesAStreamOfThisProcess(absl::string_view to) {
  if (to == "/dev/stdout" || to == "/dev/stderr") return true;
  for (absl::string_view prefix : {"/dev/fd/", "/proc/self/fd/"}) {
    if (absl::ConsumePrefix(&to, prefix)) {
      return !to.empty() && to.size() < 10 &&
             std::all_of(to.begin(), to.end(), [](char c) { return c >= '0' && c <= '9'; });
    }
  }
  return false;
}

absl::StatusOr<Target> ResolveTarget(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("the output path is empty");
  Target target{path};
  // The kind of what the links lead to: a device, FIFO or descriptor is written where it is.
  struct stat followed;
  bool descriptor = NamesADescriptor(path);
  if (stat(path.c_str(), &followed) == 0) {
    if (S_ISDIR(followed.st_mode) || S_ISBLK(followed.st_mode) || S_ISSOCK(followed.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the output '", path, "' is ", KindOf(followed.st_mode),
          "; outputs are regular files (replaced atomically), character devices or FIFOs"));
    }
    target.exists = true;
    target.mode = followed.st_mode;
    target.owner = followed.st_uid;
    target.group = followed.st_gid;
    if (S_ISCHR(followed.st_mode) || S_ISFIFO(followed.st_mode)) target.direct = true;
  } else if (errno != ENOENT) {
    return OsError(errno, "cannot inspect the output", path);
  }
  // Note [Outputs through links]: a symbolic link at the output's name is refused, never
  // written through: in a shared directory another user may have planted it to aim lockstep's
  // write at a file lockstep's user can write and they cannot. Only a link to one of the
  // process's descriptors (/dev/stdout is one) is followed: that is the caller's own stream.
  if (!descriptor) {
    struct stat info;
    if (lstat(path.c_str(), &info) != 0) {
      if (errno != ENOENT) return OsError(errno, "cannot inspect the output", path);
    } else if (S_ISLNK(info.st_mode)) {
      char buffer[PATH_MAX];
      const ssize_t n = readlink(path.c_str(), buffer, sizeof(buffer));
      const std::string to =
          n > 0 && n < static_cast<ssize_t>(sizeof(buffer)) ? std::string(buffer, n) : "?";
      if (!NamesAStreamOfThisProcess(to)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the output '", path, "' is a symbolic link (to '", to,
            "'); lockstep never writes through a link it did not make: remove it or name its "
            "target"));
      }
      descriptor = true;
    }
  }
  if (descriptor) {
    if (!target.exists) return OsError(ENOENT, "cannot open the output", path);
    target.path = path;
    target.direct = true;
  }
  return target;
}

// Opens a direct target for writing (appending: a regular file behind a descriptor's path keeps
// what its writer put there) without blocking on a FIFO with no reader (ENXIO:
// kFailedPrecondition), then makes writes blocking again.
absl::StatusOr<int> OpenDirect(const Target& target) {
  const int fd = open(target.path.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENXIO) {
      return absl::FailedPreconditionError(
          absl::StrCat("the output '", target.path, "' is a FIFO with no reader"));
    }
    return OsError(errno, "cannot open the output", target.path);
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

// Creates a new file beside `path` for writing, with mode 0666 (the umask applies, as to any
// create), under a name no other writer uses (O_EXCL, a per-process counter and a random part,
// retried on a collision) and within NAME_MAX: ".<name>.<unique>.tmp", the name shortened as
// needed.
absl::StatusOr<std::pair<int, std::string>> CreateTemporaryBeside(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  std::random_device random;
  const size_t slash = path.rfind('/');
  const std::string directory = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  for (int tries = 0; tries < 100; ++tries) {
    const std::string unique =
        absl::StrCat(".", getpid(), ".", counter.fetch_add(1), ".", random() % 1000000, ".tmp");
    const size_t room = NAME_MAX - 1 - unique.size();
    const std::string temporary =
        absl::StrCat(directory, ".", name.substr(0, std::min(room, name.size())), unique);
    const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) return std::make_pair(fd, temporary);
    if (errno != EEXIST) return OsError(errno, "cannot create a temporary file beside", path);
  }
  return absl::InternalError(
      absl::StrCat("cannot create a temporary file beside '", path, "': every name was taken"));
}

// WriteAll of each piece in order; errno is the failing write's.
bool WritePieces(int fd, absl::Span<const absl::string_view> pieces) {
  for (absl::string_view piece : pieces) {
    if (!WriteAll(fd, piece)) return false;
  }
  return true;
}

// Writes to a direct target. A FIFO or pipe whose reader has gone raises SIGPIPE, which would kill
// the process: it is blocked in this thread for the write and a pending one consumed after, so
// that the write fails with EPIPE instead.
absl::Status WriteDirectly(const Target& target, absl::Span<const absl::string_view> pieces) {
  absl::StatusOr<int> fd = OpenDirect(target);
  if (!fd.ok()) return fd.status();
  sigset_t pipe_signal, previous, pending;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  pthread_sigmask(SIG_BLOCK, &pipe_signal, &previous);
  const bool written = WritePieces(*fd, pieces);
  const int error = errno;
  if (!written && error == EPIPE && !was_pending) {
    const timespec now = {0, 0};
    sigtimedwait(&pipe_signal, nullptr, &now);
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  close(*fd);
  if (!written) return OsError(error, "cannot write", target.path);
  return absl::OkStatus();
}

absl::Status ReplaceAtomically(const Target& target, absl::Span<const absl::string_view> pieces,
                               const WriteOptions& options) {
  const std::string& path = target.path;
  absl::StatusOr<std::pair<int, std::string>> created = CreateTemporaryBeside(path);
  if (!created.ok()) return created.status();
  const auto [fd, temporary] = *created;
  if (target.exists) {
    // The replacement keeps the file's permissions (a 0600 file must not become readable by
    // others) and, where the process may, its owner.
    (void)!fchown(fd, target.owner, target.group);
    if (fchmod(fd, target.mode & 07777) != 0) {
      const int error = errno;
      close(fd);
      unlink(temporary.c_str());
      return OsError(error, "cannot set the permissions of", temporary);
    }
  }
  const bool written = WritePieces(fd, pieces);
  const int write_error = errno;
  if (!written || (options.durable && fsync(fd) != 0)) {
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
  return options.durable && options.sync_directory ? SyncParentDirectory(path) : absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Reading.

// Note [Reading a shrinking file]: a page of a file mapping that lies past the file's current end
// raises SIGBUS when touched, and a file being replaced in place (`cp new old` truncates first)
// does exactly that to any reader that mapped it. Every MappedFile registers its range here; a
// SIGBUS inside a registered range maps zero pages over the rest of it (so the faulting read and
// every later one completes) and marks the mapping, and CheckUnchanged reports it. A SIGBUS
// anywhere else goes to the disposition that was there before (by default the process dies, as
// it would have). The registry is a fixed array read lock-free by the handler.
constexpr int kSlots = 4096;

// A slot is read by the handler under a sequence lock: `version` is odd while the slot is being
// written and changes with every write, so a reader that sees the same even version before and
// after reading begin and end has a consistent pair (never one mapping's start with another's end).
struct Slot {
  std::atomic<uint64_t> version{0};
  std::atomic<uintptr_t> begin{0};  // 0: free
  std::atomic<uintptr_t> end{0};    // page-rounded end of the mapping
  std::atomic<bool> faulted{false};
};

Slot slots[kSlots];
std::atomic<int> slot_claims[kSlots];  // 0 free, 1 taken: who may write a slot
struct sigaction previous_sigbus;
uintptr_t page_size = 4096;  // set before the handler is installed (sysconf is not signal-safe)

void OnSigbus(int signal, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
  for (Slot& slot : slots) {
    const uint64_t before = slot.version.load(std::memory_order_acquire);
    if ((before & 1) != 0) continue;
    const uintptr_t begin = slot.begin.load(std::memory_order_acquire);
    const uintptr_t end = slot.end.load(std::memory_order_acquire);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.version.load(std::memory_order_relaxed) != before) continue;
    if (begin == 0 || address < begin || address >= end) continue;
    const uintptr_t page = address & ~(page_size - 1);
    void* zeros = mmap(reinterpret_cast<void*>(page), end - page, PROT_READ,
                       MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (zeros == MAP_FAILED) break;
    slot.faulted.store(true, std::memory_order_release);
    errno = saved_errno;
    return;
  }
  errno = saved_errno;
  if ((previous_sigbus.sa_flags & SA_SIGINFO) != 0 && previous_sigbus.sa_sigaction != nullptr) {
    previous_sigbus.sa_sigaction(signal, info, context);
    return;
  }
  if (previous_sigbus.sa_handler != SIG_DFL && previous_sigbus.sa_handler != SIG_IGN) {
    previous_sigbus.sa_handler(signal);
    return;
  }
  // The default: returning re-runs the faulting access, which now kills the process.
  struct sigaction fallback = {};
  fallback.sa_handler = SIG_DFL;
  sigaction(SIGBUS, &fallback, nullptr);
}

// Precondition: nothing replaces the SIGBUS handler afterwards without chaining to this one (it
// would turn a shrinking file back into a crash).
void InstallSigbusHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    page_size = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    struct sigaction action = {};
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &previous_sigbus);
  });
}

void WriteSlot(Slot& slot, uintptr_t begin, uintptr_t end) {
  slot.version.fetch_add(1, std::memory_order_acq_rel);  // odd: being written
  std::atomic_thread_fence(std::memory_order_release);
  slot.faulted.store(false, std::memory_order_relaxed);
  slot.begin.store(begin, std::memory_order_relaxed);
  slot.end.store(end, std::memory_order_relaxed);
  slot.version.fetch_add(1, std::memory_order_release);  // even again
}

int RegisterMapping(void* data, size_t size) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t end = begin + ((size + page_size - 1) & ~(page_size - 1));
  for (int i = 0; i < kSlots; ++i) {
    int expected = 0;
    if (!slot_claims[i].compare_exchange_strong(expected, 1)) continue;
    WriteSlot(slots[i], begin, end);
    return i;
  }
  return -1;
}

void UnregisterMapping(int slot) {
  if (slot < 0) return;
  WriteSlot(slots[slot], 0, 0);
  slot_claims[slot].store(0, std::memory_order_release);
}

// Opens `path` for reading as a regular file: what is not one (a FIFO, a device, a socket, a
// directory), and a /proc or /sys file (regular, but of no size known in advance), is refused
// before it is opened for reading, so that nothing can block and no device sees an open. The
// caller closes the descriptor.
absl::StatusOr<int> OpenRegularForReading(const std::string& path, struct stat* info) {
  const int handle = open(path.c_str(), O_PATH | O_CLOEXEC);
  if (handle < 0) return OsError(errno, "cannot open", path);
  absl::Status refused;
  struct statfs filesystem;
  if (fstat(handle, info) != 0) {
    refused = OsError(errno, "cannot stat", path);
  } else if (!S_ISREG(info->st_mode)) {
    refused = absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is ", KindOf(info->st_mode), ", not a regular file"));
  } else if (fstatfs(handle, &filesystem) == 0 &&
             (filesystem.f_type == PROC_SUPER_MAGIC || filesystem.f_type == SYSFS_MAGIC)) {
    refused = absl::InvalidArgumentError(
        absl::StrCat("'", path,
                     "' is a /proc or /sys file (its size is not known in advance), not a regular "
                     "file"));
  }
  if (!refused.ok()) {
    close(handle);
    return refused;
  }
  // The very file inspected, opened for reading through its handle (no race with a rename).
  int fd = open(absl::StrCat("/proc/self/fd/", handle).c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0 && errno == ENOENT) {
    // No /proc: the path again, without blocking, and checked to be the same file.
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    struct stat again;
    if (fd >= 0 &&
        (fstat(fd, &again) != 0 || again.st_dev != info->st_dev || again.st_ino != info->st_ino)) {
      close(fd);
      close(handle);
      return absl::AbortedError(
          absl::StrCat("'", path, "' was replaced while it was being opened"));
    }
  }
  const int error = errno;
  close(handle);
  if (fd < 0) return OsError(error, "cannot open", path);
  return fd;
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

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes,
                                 const WriteOptions& options) {
  return WriteFileAtomically(path, absl::Span<const absl::string_view>(&bytes, 1), options);
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::Span<const absl::string_view> pieces,
                                 const WriteOptions& options) {
  absl::StatusOr<Target> target = ResolveTarget(path);
  if (!target.ok()) return target.status();
  if (target->direct) return WriteDirectly(*target, pieces);
  return ReplaceAtomically(*target, pieces, options);
}

absl::Status CheckWritable(const std::string& path) {
  absl::StatusOr<Target> target = ResolveTarget(path);
  if (!target.ok()) return target.status();
  if (target->direct) {
    // A FIFO's reader may come later; a device must open for writing now.
    if (S_ISFIFO(target->mode)) return absl::OkStatus();
    absl::StatusOr<int> fd = OpenDirect(*target);
    if (!fd.ok()) return fd.status();
    // A write of no bytes reaches a character device's driver, which answers as it would a real
    // write (/dev/full: ENOSPC) and writes nothing.
    const bool device = S_ISCHR(target->mode);
    const int error = device && write(*fd, "", 0) < 0 ? errno : 0;
    close(*fd);
    if (error != 0) return OsError(error, "cannot write", target->path);
    return absl::OkStatus();
  }
  absl::StatusOr<std::pair<int, std::string>> created = CreateTemporaryBeside(target->path);
  if (!created.ok()) return created.status();
  close(created->first);
  unlink(created->second.c_str());
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes) {
  struct stat info;
  absl::StatusOr<int> fd = OpenRegularForReading(path, &info);
  if (!fd.ok()) return fd.status();
  const size_t size = static_cast<size_t>(info.st_size);
  if (size > max_bytes) {
    close(*fd);
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' has ", size, " bytes, more than the ", max_bytes, " allowed"));
  }
  std::string bytes(size, '\0');
  size_t done = 0;
  int error = 0;
  while (done < size) {
    const ssize_t n = pread(*fd, &bytes[done], size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) error = errno;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  char extra;
  const bool grew = error == 0 && pread(*fd, &extra, 1, static_cast<off_t>(size)) > 0;
  close(*fd);
  if (error != 0) return OsError(error, "cannot read", path);
  if (done != size || grew) {
    return absl::AbortedError(absl::StrCat("'", path, "' changed size while it was being read (",
                                           size, " bytes when opened)"));
  }
  return bytes;
}

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  struct stat info;
  absl::StatusOr<int> fd = OpenRegularForReading(path, &info);
  if (!fd.ok()) return fd.status();
  const size_t size = static_cast<size_t>(info.st_size);
  void* data = nullptr;
  int slot = -1;
  if (size > 0) {
    InstallSigbusHandler();
    data = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, *fd, 0);
    if (data == MAP_FAILED) {
      const int error = errno;
      close(*fd);
      return OsError(error, "cannot map", path);
    }
    slot = RegisterMapping(data, size);
    if (slot < 0) {
      munmap(data, size);
      close(*fd);
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot map '", path, "': ", kSlots, " files are mapped already in this process"));
    }
  }
  return std::shared_ptr<const MappedFile>(
      new MappedFile(path, *fd, data, size, slot, info.st_mtim));
}

absl::Status MappedFile::CheckUnchanged() const {
  struct stat info;
  const bool faulted = slot_ >= 0 && slots[slot_].faulted.load(std::memory_order_acquire);
  if (fstat(fd_, &info) != 0) return OsError(errno, "cannot stat", path_);
  if (faulted || static_cast<size_t>(info.st_size) != size_ ||
      info.st_mtim.tv_sec != modified_.tv_sec || info.st_mtim.tv_nsec != modified_.tv_nsec) {
    return absl::AbortedError(absl::StrCat("'", path_, "' changed while it was being read (", size_,
                                           " bytes when opened, ", info.st_size, " now",
                                           faulted ? ", and pages past its new end were read" : "",
                                           "): read it again once nothing is writing it"));
  }
  return absl::OkStatus();
}

MappedFile::~MappedFile() {
  UnregisterMapping(slot_);
  if (data_ != nullptr) munmap(data_, size_);
  close(fd_);
}

}  // namespace lockstep
