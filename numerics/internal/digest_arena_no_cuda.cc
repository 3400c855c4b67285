// numerics/internal/digest_arena_no_cuda.cc: a DigestArena in a build without CUDA, where no
// device tensor can exist (digest_arena.h).

#include "absl/status/status.h"
#include "numerics/internal/digest_arena.h"

namespace lockstep {
namespace numerics {
namespace internal {

absl::StatusOr<std::vector<DigestArena::Pending>> DigestArena::Enqueue(absl::Span<const Job> jobs) {
  if (jobs.empty()) return std::vector<Pending>();
  return absl::FailedPreconditionError(
      "digesting a device tensor: this build of lockstep has no CUDA (--config=cuda)");
}

absl::Status DigestArena::Collect() { return absl::OkStatus(); }

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
