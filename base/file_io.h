// base/file_io.h
//
// Whole-file I/O with the guarantees lockstep's tools promise: a file is written atomically
// (readers see the old contents or the new, never a part: a temporary file beside it, fsync,
// rename, fsync of the directory), and a file is read through a read-only memory mapping, so
// that a large file costs no copy and only the pages touched are read.
//
// Errors name the path and the OS reason.
//
// Thread-safety: a MappedFile is immutable and may be read from any thread.
//
// Example:
//   LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomically("out.json", text));
//   LOCKSTEP_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, MappedFile::Open(path));
//   absl::string_view bytes = file->bytes();

#ifndef LOCKSTEP_BASE_FILE_IO_H_
#define LOCKSTEP_BASE_FILE_IO_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lockstep {

// Replaces `path` with `bytes` atomically. kNotFound/kPermissionDenied/kInternal with the OS
// reason; on failure `path` is as it was and no temporary file is left. The new file gets the
// mode a plain create would give it (0666 less the process's umask, which is never changed: a
// umask toggle is process-wide and races with every other thread creating files). OK means the
// contents and the rename are durable: the file and its directory were fsynced, and a failed
// directory fsync is an error.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes);

// fsyncs the file or directory at `path` (its contents, or for a directory its entries).
// kNotFound/kPermissionDenied/kInternal naming the path and the OS reason.
absl::Status SyncPath(const std::string& path);

// fsyncs the directory that holds `path` ("." for a bare name), so that a file created, renamed
// or removed there survives power loss.
absl::Status SyncParentDirectory(const std::string& path);

// The directory part of `path`: "a/b" for "a/b/c", "/" for "/c", "." for "c".
std::string ParentDirectory(const std::string& path);

// A read-only mapping of a whole file (an empty file maps to an empty view).
class MappedFile {
 public:
  // kNotFound for a missing file, kInvalidArgument for a directory, otherwise the OS reason.
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  absl::string_view bytes() const { return {static_cast<const char*>(data_), size_}; }

 private:
  MappedFile(std::string path, void* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  void* data_;
  size_t size_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_BASE_FILE_IO_H_
