// qualification/toy_objective.h
//
// ToyObjective: a small weighted least-squares objective over a plan's tokens, for admission's
// tests and qualify's injected-out-of-memory check. Token t of input sequence s has a fixed
// input vector and target (functions of s and t only), so the gradient of a step depends only on
// which tokens contribute and with which loss weights, never on how the plan packs or splits
// them. A wave runs one forward and backward per microbatch (in the wave's order) over the tokens
// the given CP rank owns, with the plan's loss scales, accumulating into the parameter's .grad.
//
// Thread-safety: one thread at a time per objective.

#ifndef LOCKSTEP_QUALIFICATION_TOY_OBJECTIVE_H_
#define LOCKSTEP_QUALIFICATION_TOY_OBJECTIVE_H_

#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "admission/recovery.h"

namespace lockstep {
namespace qualification {

class ToyObjective {
 public:
  // A parameter vector of `features` float64 values (>= 1), fixed by `seed`.
  static absl::StatusOr<ToyObjective> Create(int features, int seed);

  // Forward and backward of `work` on CP rank `cp_rank` (a rank owning none of a microbatch's
  // tokens contributes nothing for it).
  absl::Status RunWave(const admission::WaveWork& work, int cp_rank);

  at::Tensor& weight() { return weight_; }
  std::vector<at::Tensor> parameters() const { return {weight_}; }

 private:
  explicit ToyObjective(at::Tensor weight) : weight_(std::move(weight)) {}
  at::Tensor weight_;
};

// max |a - b| / max(|b|, tiny) over elements; 0 for equal tensors.
double MaxRelativeDifference(const at::Tensor& a, const at::Tensor& b);

}  // namespace qualification
}  // namespace lockstep

#endif  // LOCKSTEP_QUALIFICATION_TOY_OBJECTIVE_H_
