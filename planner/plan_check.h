// planner/plan_check.h
//
// VerifyPlan checks a Plan against the batch it claims to cover, independently of how the plan
// was made: the property tests run it on every plan they build, and a trainer can run it on a
// plan it received instead of computed. It works on token ranges, not tokens: O(sequences x
// cp_size^2 + per-token weights), even for long sequences; every size it reads is checked
// before it is used, so an arbitrary (hostile) plan gets a status, never an abort or overflow.
//
// What it checks (the first violation is returned as kInvalidArgument naming the microbatch,
// the packed sequence or CP rank, and the values):
//   - limits: a CP size in [1, kMaxCpSize], a budget of at least 2 x cp_size, known packing
//     policies (the applied one in order when the limits ask for in order), a known
//     normalisation and CP chunk rule; splits in [0, microbatches - 1]; the batch plannable
//     (positive lengths, total within 64 bits); totals and the loss weight total match the
//     batch; the loss weights digest matches the batch's weights (LossWeightsDigest);
//   - every microbatch: consistent per-sequence arrays, cu_seqlens starting at 0 and strictly
//     increasing, at least one sequence, at most max_tokens_per_microbatch tokens, ids and token
//     ranges matching the batch;
//   - every token of every sequence appears exactly once across microbatches, and, within each
//     microbatch, exactly once across the pieces that ShardPieces derives for the CP ranks;
//   - shards: exactly cp_size entries (rank, tokens, pieces), in rank order; every derived piece
//     inside one packed sequence, on a chunk the rank owns (i or 2 * cp_size - 1 - i), chunks in
//     position order; each entry's stored token and piece counts equal to its derived pieces'
//     token sum and count (0 and 0 for a rank that owns nothing); per-rank token counts
//     differing by at most 2;
//   - loss scales: equal to what the plan's normalisation gives for the batch (relative 1e-12).
//
// Thread-safety: stateless.
//
// Example:
//   LOCKSTEP_RETURN_IF_ERROR(planner::VerifyPlan(received_plan, batch));

#ifndef LOCKSTEP_PLANNER_PLAN_CHECK_H_
#define LOCKSTEP_PLANNER_PLAN_CHECK_H_

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "planner/plan.pb.h"
#include "planner/planner.h"

namespace lockstep {
namespace planner {

// OK when `plan` is a valid plan of `batch` (see above); otherwise the first violation found.
absl::Status VerifyPlan(const Plan& plan, absl::Span<const Sequence> batch);

}  // namespace planner
}  // namespace lockstep

#endif  // LOCKSTEP_PLANNER_PLAN_CHECK_H_
