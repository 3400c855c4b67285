// base/temp_dir.h
//
// TempDir: a fresh directory of one's own under the test's or the user's temporary directory
// ($TEST_TMPDIR, else $TMPDIR, else /tmp), made with mkdtemp (a unique name, never a reused one:
// inside Bazel's sandbox pids repeat across runs, so names built from the pid collide), removed
// with everything in it when the TempDir is destroyed, on every exit path that unwinds.
//
// Thread-safety: a TempDir is used by one thread; distinct ones are independent.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(TempDir dir, TempDir::Make("oracle"));
//   const std::string state = dir.path() + "/after_step0";
//   ...                                    // removed when `dir` goes out of scope

#ifndef LOCKSTEP_BASE_TEMP_DIR_H_
#define LOCKSTEP_BASE_TEMP_DIR_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lockstep {

// A directory made by Make and owned by this object: removed, with its contents, on destruction.
class TempDir {
 public:
  // A new directory "<root>/lockstep_<prefix>_XXXXXX". kInternal naming the root and the OS
  // reason if it cannot be made.
  static absl::StatusOr<TempDir> Make(absl::string_view prefix);

  // The root it is made under: $TEST_TMPDIR, else $TMPDIR, else /tmp.
  static std::string Root();

  // Takes over `other`'s directory; `other` then owns none, and its destruction removes nothing.
  TempDir(TempDir&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  // Removes the directory this one owns, if any, then takes over `other`'s as the constructor does.
  TempDir& operator=(TempDir&& other) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // Removes the directory and everything in it (best effort; symbolic links are removed, not
  // followed).
  ~TempDir();

  // The directory's path, "<root>/lockstep_<prefix>_XXXXXX" (empty once moved from).
  const std::string& path() const { return path_; }

  // Keeps the directory for a reader (something in it needs looking into): returns its path and
  // owns none from then on, so destruction removes nothing.
  std::string Release() {
    std::string kept = std::move(path_);
    path_.clear();
    return kept;
  }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// Removes `path` and everything below it without following symbolic links (best effort).
void RemoveTree(const std::string& path);

}  // namespace lockstep

#endif  // LOCKSTEP_BASE_TEMP_DIR_H_
