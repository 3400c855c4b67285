// python/src/status.h
//
// The Python boundary's one rule for errors: an absl::Status that is not OK becomes a Python
// exception of lockstep.errors with the status's message unchanged — kInvalidArgument and
// kOutOfRange as ValueError subclasses, every other code as a LockstepError (a RuntimeError)
// subclass; each carries the code as `.code` (the absl::StatusCode name, "DEADLINE_EXCEEDED").

#ifndef LOCKSTEP_PYTHON_SRC_STATUS_H_
#define LOCKSTEP_PYTHON_SRC_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lockstep {
namespace python {

// Raises `status` as its lockstep.errors exception (throws pybind11::error_already_set).
// Precondition: !status.ok(), and the GIL is held.
[[noreturn]] void Raise(const absl::Status& status);

inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) Raise(value.status());
  return *std::move(value);
}

}  // namespace python
}  // namespace lockstep

#endif  // LOCKSTEP_PYTHON_SRC_STATUS_H_
