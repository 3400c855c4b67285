// qualification/internal/checks.h  (private to //qualification)
//
// What qualify's check families (rng_checks.cc, recompute_check.cc, oom_check.cc,
// trainer_check.cc) share: the caller draws the RNG checks compare, the members that disagree
// with their TP x CP leader, the rewind to the synchronized caller state every check starts from,
// and model work on the model stream (or, under the unscoped-model-work control, the caller's).
//
// Thread-safety: as the rank's streams (one thread).

#ifndef LOCKSTEP_QUALIFICATION_INTERNAL_CHECKS_H_
#define LOCKSTEP_QUALIFICATION_INTERNAL_CHECKS_H_

#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "collectives/topology.h"
#include "qualification/qualification.h"
#include "rng/model_stream.h"

namespace lockstep {
namespace qualification {
namespace internal {

// A uniform draw, a dropout mask and a token mask from the caller's generator, concatenated.
at::Tensor CallerDraws();

// Members of each TP x CP group whose gathered value differs from their leader's.
std::vector<int> DisagreeWithLeader(const collectives::Topology& topo,
                                    const std::vector<at::Tensor>& values);

// Puts the caller state the checks start from back in place.
absl::Status Rewind(const RankSetup& setup);

// "0, 2, 5"
std::string Ranks(const std::vector<int>& ranks);

// Runs `work` on the model stream, or — under the unscoped-model-work control — on the caller's.
template <typename Work>
absl::Status OnModelStream(RankSetup& setup, Work&& work) {
  if (setup.control == NegativeControl::kUnscopedModelWork) {
    return CallTorch("model work", std::forward<Work>(work));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(rng::ModelStreamScope scope,
                            rng::ModelStreamScope::Enter(*setup.streams));
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("model work", std::forward<Work>(work)));
  return scope.Exit();
}

}  // namespace internal
}  // namespace qualification
}  // namespace lockstep

#endif  // LOCKSTEP_QUALIFICATION_INTERNAL_CHECKS_H_
