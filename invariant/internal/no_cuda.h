// The status every CUDA entry point of the mode returns in a build without CUDA
// (internal/device_ops_no_cuda.cc, internal/device_exact_no_cuda.cc).

#ifndef LOCKSTEP_INVARIANT_INTERNAL_NO_CUDA_H_
#define LOCKSTEP_INVARIANT_INTERNAL_NO_CUDA_H_

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace lockstep {
namespace invariant {
namespace internal {

// kUnimplemented naming `what` and how to build with CUDA.
inline absl::Status NoCuda(absl::string_view what) {
  return absl::UnimplementedError(absl::StrCat(
      what, " on CUDA: this lockstep was built without CUDA (build with --config=cuda)"));
}

}  // namespace internal
}  // namespace invariant
}  // namespace lockstep

#endif  // LOCKSTEP_INVARIANT_INTERNAL_NO_CUDA_H_
