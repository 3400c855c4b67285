// base/status_macros.h
//
// Macros that pass an absl::Status up the stack, optionally with context added on the way
// ("while broadcasting the plan to group [0, 1]"), so that the error a user finally reads says
// where it came from and what the library was doing.
//
// Example:
//   LOCKSTEP_RETURN_IF_ERROR(comm.Barrier());
//   LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(comm.Broadcast(t, 0), "while sending the seed");
//   LOCKSTEP_ASSIGN_OR_RETURN(Topology topo, Topology::Create(8, 2, 2));

#ifndef LOCKSTEP_BASE_STATUS_MACROS_H_
#define LOCKSTEP_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lockstep {

// Returns `status` with `context` appended to its message ("<message>; <context>"); the code
// is kept. OK statuses are returned unchanged.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace lockstep

#define LOCKSTEP_STATUS_CONCAT_INNER_(a, b) a##b
#define LOCKSTEP_STATUS_CONCAT_(a, b) LOCKSTEP_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function with the status of `expr` if it is not OK.
#define LOCKSTEP_RETURN_IF_ERROR(expr)                   \
  do {                                                   \
    ::absl::Status lockstep_status_ = (expr);            \
    if (!lockstep_status_.ok()) return lockstep_status_; \
  } while (0)

// As LOCKSTEP_RETURN_IF_ERROR, adding `context` (a string expression, evaluated only on error).
#define LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(expr, context)    \
  do {                                                          \
    ::absl::Status lockstep_status_ = (expr);                   \
    if (!lockstep_status_.ok()) {                               \
      return ::lockstep::Annotate(lockstep_status_, (context)); \
    }                                                           \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, else moves the value
// into `lhs`, which may be a declaration.
#define LOCKSTEP_ASSIGN_OR_RETURN(lhs, rexpr) \
  LOCKSTEP_ASSIGN_OR_RETURN_IMPL_(LOCKSTEP_STATUS_CONCAT_(lockstep_statusor_, __LINE__), lhs, rexpr)

#define LOCKSTEP_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                    \
  if (!statusor.ok()) return statusor.status();               \
  lhs = std::move(statusor).value()

#endif  // LOCKSTEP_BASE_STATUS_MACROS_H_
