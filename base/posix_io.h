// base/posix_io.h
//
// Small POSIX helpers that several lockstep programs need: writing a whole buffer to a file
// descriptor despite short writes and EINTR, and finding a free TCP port on the loopback address
// (for rendezvous stores of local worlds).
//
// Thread-safety: stateless.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(int port, FreeLoopbackPort());
//   WriteAll(STDOUT_FILENO, absl::StrCat("MASTER_PORT=", port, "\n"));

#ifndef LOCKSTEP_BASE_POSIX_IO_H_
#define LOCKSTEP_BASE_POSIX_IO_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lockstep {

// Writes all of `bytes` to `fd`, retrying short writes and EINTR. Returns false if the descriptor
// stops accepting bytes (closed pipe, error), after writing what it could, with errno saying why.
bool WriteAll(int fd, absl::string_view bytes);

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released). Another
// process may take it before the caller binds it; callers that cannot tolerate that must retry.
absl::StatusOr<int> FreeLoopbackPort();

}  // namespace lockstep

#endif  // LOCKSTEP_BASE_POSIX_IO_H_
