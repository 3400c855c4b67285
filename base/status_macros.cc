#include "base/status_macros.h"

#include "absl/strings/str_cat.h"

namespace lockstep {

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok() || context.empty()) return status;
  return absl::Status(status.code(), absl::StrCat(status.message(), "; ", context));
}

}  // namespace lockstep
