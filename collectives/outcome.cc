#include "collectives/outcome.h"

#include <string>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"

namespace lockstep {
namespace collectives {

int64_t GroupOutcome::out_of_memory() const {
  int64_t count = 0;
  for (absl::StatusCode code : codes) count += code == absl::StatusCode::kResourceExhausted;
  return count;
}

int64_t GroupOutcome::failed() const {
  int64_t count = 0;
  for (absl::StatusCode code : codes) {
    count += code != absl::StatusCode::kOk && code != absl::StatusCode::kResourceExhausted;
  }
  return count;
}

absl::Status GroupOutcome::ForMember(const absl::Status& local, absl::string_view what) const {
  if (ok()) return absl::OkStatus();
  if (!local.ok()) return Annotate(local, what);
  return absl::AbortedError(absl::StrCat(what, ": global rank ", first_failed_global,
                                         " of the group failed it (", first_failure.ToString(),
                                         "); every member stops"));
}

absl::StatusOr<GroupOutcome> AgreeOnOutcome(Communicator* group, const absl::Status& local) {
  GroupOutcome outcome;
  if (WithOthers(group) == nullptr) {  // Note [A group of one is no group]
    outcome.codes = {local.code()};
    if (!local.ok()) {
      outcome.first_failed = 0;
      outcome.first_failed_global = group == nullptr ? -1 : group->global_ranks()[0];
      outcome.first_failure = local;
    }
    return outcome;
  }
  at::Tensor code;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("building the outcome vote", [&] {
    code = at::full({1}, static_cast<int64_t>(local.code()), at::kLong);
  }));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> codes, group->AllGather(code));
  for (int m = 0; m < group->size(); ++m) {
    const int64_t value = codes[m].item<int64_t>();
    outcome.codes.push_back(static_cast<absl::StatusCode>(value));
    if (value != 0 && outcome.first_failed < 0) outcome.first_failed = m;
  }
  if (outcome.ok()) return outcome;
  // Only now: the first failing member tells the others what went wrong.
  std::string message = std::string(local.message());
  LOCKSTEP_RETURN_IF_ERROR(BroadcastBytes(*group, &message, outcome.first_failed));
  outcome.first_failed_global = group->global_ranks()[outcome.first_failed];
  outcome.first_failure = absl::Status(outcome.codes[outcome.first_failed], message);
  return outcome;
}

}  // namespace collectives
}  // namespace lockstep
