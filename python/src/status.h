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
#include "pybind11/pybind11.h"

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

// Note [GIL]: every binding that may block (a collective, a training step, a checkpoint, the
// adoption of a group) runs the C++ call through Released: the GIL is given up for the call and
// taken back before its status is raised. Holding it would deadlock: a Gloo worker thread that
// drops the last reference to a tensor Python made takes the GIL to free the tensor's Python
// object, while this thread waits for that worker's collective. Python callables the call
// invokes take the GIL themselves (python_function.h, trainer_bindings.cc). Arguments that need
// the GIL to build are built before.
template <typename F>
auto Released(F&& call) -> decltype(call()) {
  pybind11::gil_scoped_release release;
  return call();
}

}  // namespace python
}  // namespace lockstep

#endif  // LOCKSTEP_PYTHON_SRC_STATUS_H_
