// collectives/outcome.h
//
// Outcome agreement: after work that each member of a group ran on its own (a model's forward on
// its shard, a factory), the members exchange how it went, so that every member takes the same
// path next — all go on to the collective that follows, or none does. Without it a member whose
// work failed returns at once while its peers wait in the next collective until the timeout and
// then report the timeout instead of the cause (or, worse, the failed member's next call meets
// their collective out of step).
//
// Note [Outcome agreement]: every member calls AgreeOnOutcome once per attempt, failed or not,
// with its own status. One all-gather of one status code per member decides; only when some
// member failed does the first failing member (lowest group rank) broadcast its message, so every
// member can name the failing rank and its error. The success path costs one small all-gather.
//
// Thread-safety: as the communicator's.
//
// Example:
//   absl::Status local = RunMyShard();
//   LOCKSTEP_ASSIGN_OR_RETURN(collectives::GroupOutcome outcome,
//                             collectives::AgreeOnOutcome(group, local));
//   LOCKSTEP_RETURN_IF_ERROR(outcome.ForMember(local, "microbatch 3: the model's forward"));
//   // every member reaches here, or none does

#ifndef LOCKSTEP_COLLECTIVES_OUTCOME_H_
#define LOCKSTEP_COLLECTIVES_OUTCOME_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "collectives/communicator.h"

namespace lockstep {
namespace collectives {

// What the members of a group made of one attempt.
struct GroupOutcome {
  // Per group rank: its attempt's status code.
  std::vector<absl::StatusCode> codes;
  // The group rank of the first member whose attempt failed (the lowest); -1 when every member
  // succeeded.
  int first_failed = -1;
  // The first failing member's global rank; -1 when every member succeeded.
  int first_failed_global = -1;
  // The first failing member's status (code and message); OK when every member succeeded.
  absl::Status first_failure;

  // Whether every member's attempt succeeded.
  bool ok() const { return first_failed < 0; }
  // Members that ran out of memory (kResourceExhausted).
  int64_t out_of_memory() const;
  // Members that failed otherwise.
  int64_t failed() const;
  // Whether every failing member ran out of memory (and at least one did).
  bool only_out_of_memory() const { return !ok() && failed() == 0; }

  // This member's result of the attempt `what`: OK when every member succeeded; this member's own
  // `local` status (annotated with `what`) when it failed; else kAborted naming `what`, the first
  // failing member's global rank and its error.
  absl::Status ForMember(const absl::Status& local, absl::string_view what) const;
};

// Exchanges `local` across `group` (Note [Outcome agreement]). Without a group, or in a group of
// one, this member's own outcome. The communicator's error (a dead or late peer) is returned as
// it is.
absl::StatusOr<GroupOutcome> AgreeOnOutcome(Communicator* group, const absl::Status& local);

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_OUTCOME_H_
