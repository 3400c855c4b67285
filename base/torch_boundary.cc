#include "base/torch_boundary.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "c10/util/Exception.h"

namespace lockstep {
namespace {

absl::Status Make(absl::StatusCode code, absl::string_view context, absl::string_view what) {
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
  } catch (const c10::Error& e) {
    return Make(absl::StatusCode::kInternal, context, e.what_without_backtrace());
  } catch (const std::bad_alloc& e) {
    return Make(absl::StatusCode::kResourceExhausted, context, e.what());
  } catch (const std::exception& e) {
    return Make(absl::StatusCode::kInternal, context, e.what());
  } catch (...) {
    return Make(absl::StatusCode::kInternal, context, "unknown exception");
  }
}

}  // namespace lockstep
