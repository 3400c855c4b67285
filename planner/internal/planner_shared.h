// planner/internal/planner_shared.h  (private to planner/)
//
// What the planner's files share: planner.cc (planning and re-planning), plan_readers.cc (the
// token and shard queries of planner.h) and plan_digest.cc (a plan's bytes and digests).
//
// Thread-safety: stateless.

#ifndef LOCKSTEP_PLANNER_INTERNAL_PLANNER_SHARED_H_
#define LOCKSTEP_PLANNER_INTERNAL_PLANNER_SHARED_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/sha256.h"
#include "planner/plan.pb.h"
#include "planner/planner.h"

namespace lockstep {
namespace planner {
namespace internal {

// "sequence <index> (id <id>)": how errors name sequence `index` of `batch`.
inline std::string SequenceName(absl::Span<const Sequence> batch, size_t index) {
  return absl::StrCat("sequence ", index, " (id ", batch[index].id, ")");
}

// Whether the compact per-sequence arrays of a microbatch of n packed sequences have a size
// plan.proto allows: token_begin 0 or n entries, loss_scale 1 or n.
inline bool ValidCompactSizes(const Microbatch& mb, int n) {
  return (mb.token_begin_size() == 0 || mb.token_begin_size() == n) &&
         (mb.loss_scale_size() == 1 || mb.loss_scale_size() == n);
}

// cu_seqlens of `mb` starts at 0 and increases strictly (every packed sequence holds a token).
// Errors start with `what` ("microbatch 3").
absl::Status CheckBoundaries(const Microbatch& mb, absl::string_view what);

// LossWeightsDigest of a batch whose first sequence with loss weights is known (-1: none), so that
// planning, which finds it while validating, does not scan the batch again.
Sha256Digest LossWeightsDigestFrom(absl::Span<const Sequence> batch, int64_t first_weighted);

}  // namespace internal
}  // namespace planner
}  // namespace lockstep

#endif  // LOCKSTEP_PLANNER_INTERNAL_PLANNER_SHARED_H_
