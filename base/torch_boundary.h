// base/torch_boundary.h
//
// The one place where LibTorch's and c10d's exceptions become absl::Status. lockstep's public
// APIs never throw; every LibTorch or c10d call that can throw runs inside CallTorch, which maps
// by exception type, never by message text:
//   c10::OutOfMemoryError, std::bad_alloc            -> kResourceExhausted (back off / shrink)
//   c10::ValueError, IndexError, TypeError           -> kInvalidArgument   (fix the input)
//   c10::NotImplementedError                         -> kUnimplemented
//   c10::DistError (LibTorch >= 2.1: network, store,
//     backend errors) and gloo::Exception            -> kUnavailable       (a peer or the
//                                                                          transport failed)
//   any other c10::Error or std::exception           -> kInternal
// and starts the message with `context` ("<context>: <exception text>", without C++ backtrace)
// so the caller learns what was being attempted. Communicators then tell a peer that did not
// arrive in time from one that is gone by their own clock, since c10d reports both as the same
// exception type (collectives/internal/communicator_base.h).
//
// Note [Context order]: a status message reads from the innermost operation outwards. CallTorch
// writes "<operation>: <what failed>"; each caller on the way up appends its own context with
// Annotate (base/status_macros.h): "<operation>: <what failed>; while <outer step>; ...".
//
// Thread-safety: stateless.
//
// Example:
//   absl::Status s = CallTorch("while copying the plan to the device",
//                              [&] { device_plan = plan.to(at::kCUDA); });

#ifndef LOCKSTEP_BASE_TORCH_BOUNDARY_H_
#define LOCKSTEP_BASE_TORCH_BOUNDARY_H_

#include <exception>
#include <new>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lockstep {

// Converts the exception in flight (call only from a catch block) into a status whose message
// starts with `context`.
absl::Status StatusFromCurrentException(absl::string_view context);

// The inverse, for code that can only report by throwing (autograd's backward, a function run by
// Checkpoint): throws the LibTorch exception that StatusFromCurrentException maps back to
// `status`'s code — kResourceExhausted as c10::OutOfMemoryError, kInvalidArgument as
// c10::ValueError, kUnimplemented as c10::NotImplementedError, kUnavailable as a c10d
// network error (gloo's I/O error before LibTorch 2.1), anything else as c10::Error — with
// `status`'s message. Precondition: !status.ok().
[[noreturn]] void ThrowAsTorchError(const absl::Status& status);

// Runs `fn`, converting any exception it throws into a status. `fn` returns void, absl::Status
// or absl::StatusOr<T>; CallTorch returns absl::Status or the same StatusOr<T>.
template <typename Fn>
auto CallTorch(absl::string_view context, Fn&& fn) {
  using Result = std::invoke_result_t<Fn>;
  if constexpr (std::is_void_v<Result>) {
    try {
      std::forward<Fn>(fn)();
      return absl::OkStatus();
    } catch (...) {
      return StatusFromCurrentException(context);
    }
  } else {
    try {
      return Result(std::forward<Fn>(fn)());
    } catch (...) {
      return Result(StatusFromCurrentException(context));
    }
  }
}

}  // namespace lockstep

#endif  // LOCKSTEP_BASE_TORCH_BOUNDARY_H_
