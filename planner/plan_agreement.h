// planner/plan_agreement.h
//
// CheckPlanAgreement: the check the trainer runs across a TP x CP group before it executes a
// plan. Every member computed its plan from what should be the same input; if any member's plan
// differs (a different batch, including a single different per-token loss weight, which the plan
// covers through Plan.loss_weights_digest; different limits; a different library build), the
// replicas would compute different losses and backward would mix their gradients silently. Each
// member contributes its plan's digest (PlanDigest) to a collective agreement check
// (collectives/agreement.h), so either every member gets OK or every member gets the same
// kFailedPrecondition naming which global ranks hold which digest.
//
// This is the planner's only dependency on collectives (and so on LibTorch).
//
// Thread-safety: as the communicator's.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(planner::Plan plan, planner::PlanMicrobatches(batch, options));
//   LOCKSTEP_RETURN_IF_ERROR(planner::CheckPlanAgreement(tp_cp_group, plan));

#ifndef LOCKSTEP_PLANNER_PLAN_AGREEMENT_H_
#define LOCKSTEP_PLANNER_PLAN_AGREEMENT_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "collectives/communicator.h"
#include "planner/plan.pb.h"

namespace lockstep {
namespace planner {

// The operation name under which plan digests are compared (it appears in mismatch errors).
inline constexpr char kPlanAgreementOperation[] = "planner/plan";

// OK when every member of `group` holds a plan with the same digest (and the same `execution`:
// how the caller will run the plan, such as its admission into waves, which must agree too for
// the members' collectives to match). Otherwise kFailedPrecondition on every member, naming the
// global ranks of each group of agreeing members and their digest prefixes; errors of the
// collective itself (a dead or late peer) are returned with context. Collective: every member
// must call it.
absl::Status CheckPlanAgreement(collectives::Communicator& group, const Plan& plan,
                                absl::string_view execution = "");

}  // namespace planner
}  // namespace lockstep

#endif  // LOCKSTEP_PLANNER_PLAN_AGREEMENT_H_
