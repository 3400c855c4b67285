#include "base/torch_boundary.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "c10/util/Exception.h"
#include "gloo/common/error.h"
#include "torch/version.h"

// c10::DistError and its subclasses (DistNetworkError, DistStoreError, DistBackendError) exist
// from LibTorch 2.1 on; older c10d throws gloo's or plain std exceptions.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define LOCKSTEP_HAS_C10_DIST_ERROR 1
#else
#define LOCKSTEP_HAS_C10_DIST_ERROR 0
#endif

namespace lockstep {
namespace {

absl::Status Make(absl::StatusCode code, absl::string_view context, absl::string_view what) {
  // Keep the first line only: some c10d and gloo messages carry a backtrace below it.
  what = what.substr(0, what.find('\n'));
  if (context.empty()) return absl::Status(code, what);
  return absl::Status(code, absl::StrCat(context, ": ", what));
}

}  // namespace

absl::Status StatusFromCurrentException(absl::string_view context) {
  try {
    throw;
  } catch (const c10::OutOfMemoryError& e) {
    return Make(absl::StatusCode::kResourceExhausted, context, e.what_without_backtrace());
  } catch (const c10::ValueError& e) {
    return Make(absl::StatusCode::kInvalidArgument, context, e.what_without_backtrace());
  } catch (const c10::IndexError& e) {
    return Make(absl::StatusCode::kInvalidArgument, context, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    return Make(absl::StatusCode::kInvalidArgument, context, e.what_without_backtrace());
  } catch (const c10::NotImplementedError& e) {
    return Make(absl::StatusCode::kUnimplemented, context, e.what_without_backtrace());
#if LOCKSTEP_HAS_C10_DIST_ERROR
  } catch (const c10::DistError& e) {
    return Make(absl::StatusCode::kUnavailable, context, e.what_without_backtrace());
#endif
  } catch (const c10::Error& e) {
    return Make(absl::StatusCode::kInternal, context, e.what_without_backtrace());
  } catch (const gloo::Exception& e) {
    return Make(absl::StatusCode::kUnavailable, context, e.what());
  } catch (const std::bad_alloc& e) {
    return Make(absl::StatusCode::kResourceExhausted, context, e.what());
  } catch (const std::exception& e) {
    return Make(absl::StatusCode::kInternal, context, e.what());
  } catch (...) {
    return Make(absl::StatusCode::kInternal, context, "unknown exception");
  }
}

void ThrowAsTorchError(const absl::Status& status) {
  const std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kResourceExhausted:
      TORCH_CHECK_WITH(OutOfMemoryError, false, message);
      break;
    case absl::StatusCode::kInvalidArgument:
      TORCH_CHECK_VALUE(false, message);
      break;
    case absl::StatusCode::kUnimplemented:
      TORCH_CHECK_NOT_IMPLEMENTED(false, message);
      break;
    case absl::StatusCode::kUnavailable:
#if LOCKSTEP_HAS_C10_DIST_ERROR
      C10_THROW_ERROR(DistNetworkError, message);
#else
      throw gloo::IoException(message);  // before c10::DistError, c10d's transport errors
#endif
      break;
    default:
      TORCH_CHECK(false, message);
  }
  __builtin_unreachable();
}

}  // namespace lockstep
