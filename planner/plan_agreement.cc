#include "planner/plan_agreement.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "collectives/agreement.h"
#include "planner/planner.h"

namespace lockstep {
namespace planner {

absl::Status CheckPlanAgreement(collectives::Communicator& group, const Plan& plan,
                                absl::string_view execution) {
  const Sha256Digest digest = PlanDigest(plan);
  std::string metadata(reinterpret_cast<const char*>(digest.data()), digest.size());
  metadata.append(execution.data(), execution.size());
  return Annotate(collectives::CheckAgreement(group, kPlanAgreementOperation, metadata),
                  absl::StrCat("while checking a plan of ", plan.microbatches_size(),
                               " microbatches (digest ", DigestHex(digest, 8), ")"));
}

}  // namespace planner
}  // namespace lockstep
