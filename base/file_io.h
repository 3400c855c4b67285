// base/file_io.h
//
// The one reading and the one writing primitive every lockstep tool and library reader goes
// through, with the guarantees lockstep promises for hostile files and faults.
//
// Writing (WriteFileAtomically): readers see the old contents or the new, never a part. A regular
// file (or a name that does not exist yet) is replaced through a temporary file beside it, under a
// name within NAME_MAX whatever the target's length, fsynced, renamed over the target, and the
// directory fsynced. A symbolic link at the output's name is refused (Note [Outputs through links]
// in file_io.cc: it may have been planted by another user), except a link to one of the
// process's own descriptors. A character device or FIFO (/dev/null, /dev/stdout, a pipe) is written
// directly, never replaced by a regular file, and so is a path that names one of the process's open
// descriptors (/dev/stdout, /dev/fd/N, /proc/self/fd/N), appended to whatever file it is; a reader
// that has gone is an error, never a SIGPIPE. A replaced file keeps its permissions (and, where
// the process may set it, its owner). A directory, a block device or a socket is refused.
// CheckWritable finds a target that cannot be written before any work is done, creating nothing
// under its name.
//
// Reading (MappedFile, ReadFileToString): only regular files. A FIFO, a device, a socket or a
// /proc or /sys file (whose size is not known in advance) is refused as not a regular file
// before it is opened for reading (so nothing can block on it and no device sees an open). A file
// is mapped read-only, so that a large file costs no copy; if it shrinks while mapped (another
// process truncates or rewrites it: `cp new old`), the pages past its new end read as zeros instead
// of raising SIGBUS (Note [Reading a shrinking file]), and CheckUnchanged reports that the file
// changed while it was read. A reader that must not trust what it read calls CheckUnchanged after
// reading.
//
// Errors name the path and the OS reason.
//
// Thread-safety: a MappedFile is immutable and may be read from any thread; the functions are
// thread-safe.
//
// Example:
//   LOCKSTEP_RETURN_IF_ERROR(CheckWritable(out));  // before the work
//   ...
//   LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomically(out, text));
//   LOCKSTEP_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, MappedFile::Open(path));
//   absl::string_view bytes = file->bytes();
//   ...
//   LOCKSTEP_RETURN_IF_ERROR(file->CheckUnchanged());

#ifndef LOCKSTEP_BASE_FILE_IO_H_
#define LOCKSTEP_BASE_FILE_IO_H_

#include <sys/types.h>

#include <cstddef>
#include <ctime>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace lockstep {

// How WriteFileAtomically writes.
struct WriteOptions {
  // fsync the file and its directory before returning (a regular file's replacement survives
  // power loss). Without it the replacement is still atomic for readers and survives the process
  // being killed.
  bool durable = true;
  // With durable: also fsync the directory after the rename. A group of files written into one
  // directory, the last of them a commit marker (a state capture), leaves it false on all but the
  // marker: one directory fsync after the marker's rename makes every name durable, the earlier
  // ones included (their contents were fsynced before it).
  bool sync_directory = true;
};

// Writes `bytes` to `path` as the top of this file says. kInvalidArgument for an empty path, a
// directory, a block device, a socket or a symbolic-link loop; kFailedPrecondition for a FIFO
// with no reader; kNotFound/kPermissionDenied/kResourceExhausted (a full disk, /dev/full)/
// kInternal with the OS reason. On failure a regular target is as it was and no temporary file is
// left. A new file gets the mode a plain create would give it (0666 less the process's umask,
// which is never changed: a umask toggle is process-wide and races with every other thread).
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes,
                                 const WriteOptions& options = WriteOptions());
// The same, writing `pieces` one after another (the file's bytes are their concatenation):
// large parts are written from where they lie, never copied into one buffer first.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::Span<const absl::string_view> pieces,
                                 const WriteOptions& options = WriteOptions());

// Whether WriteFileAtomically(path, ...) could succeed now, found without writing: the target's
// kind is one it writes, and for a regular file its directory takes a new file (a temporary is
// created and removed). Errors as WriteFileAtomically's; nothing is created under `path`.
absl::Status CheckWritable(const std::string& path);

// fsyncs the file or directory at `path` (its contents, or for a directory its entries).
// kNotFound/kPermissionDenied/kInternal naming the path and the OS reason.
absl::Status SyncPath(const std::string& path);

// fsyncs the directory that holds `path` ("." for a bare name), so that a file created, renamed
// or removed there survives power loss.
absl::Status SyncParentDirectory(const std::string& path);

// The directory part of `path`: "a/b" for "a/b/c", "/" for "/c", "." for "c".
std::string ParentDirectory(const std::string& path);

// The contents of the regular file `path`, at most `max_bytes` of them: kInvalidArgument for a
// file that is not regular or is larger (naming its size and the limit), kAborted if it changed
// size while being read, otherwise as MappedFile::Open.
absl::StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes);

// A read-only mapping of a whole regular file (an empty file maps to an empty view).
class MappedFile {
 public:
  // kNotFound for a missing file; kInvalidArgument for a directory or anything else that is not
  // a regular file, naming what it is; otherwise the OS reason.
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // The path the file was opened by.
  const std::string& path() const { return path_; }
  // The file's contents as mapped, valid while this MappedFile lives. Pages past the file's end,
  // should it shrink, read as zeros: see CheckUnchanged.
  absl::string_view bytes() const { return {static_cast<const char*>(data_), size_}; }

  // OK if the file is as it was when mapped: no page of the mapping was found past the file's
  // end, and its size and modification time are unchanged. Otherwise kAborted naming the path:
  // what was read may mix old and new contents (or zeros) and must not be used.
  absl::Status CheckUnchanged() const;

 private:
  MappedFile(std::string path, int fd, void* data, size_t size, int slot, timespec modified)
      : path_(std::move(path)),
        fd_(fd),
        data_(data),
        size_(size),
        slot_(slot),
        modified_(modified) {}

  std::string path_;
  int fd_;  // kept open to see the file's size and time later
  void* data_;
  size_t size_;
  int slot_;  // in the registry of Note [Reading a shrinking file]; -1 for an empty file
  timespec modified_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_BASE_FILE_IO_H_
