// admission/gradient_staging.h
//
// GradientStaging: the ContributionStaging (recovery.h) of a set of parameters' gradients.
// Begin moves each parameter's accumulated gradient aside (no copy), so backward writes the
// attempt's contribution into a fresh .grad; Commit adds the fresh gradient to the accumulated
// one (accumulated + contribution, the same addition LibTorch's gradient accumulation does, so
// results are bit-identical to accumulating directly) and puts it back; Discard drops the fresh
// gradient and restores the accumulated one untouched.
//
// Memory: no extra copy of the gradients; during an attempt the accumulated and the fresh
// gradients both exist, as they would while LibTorch accumulates.
//
// Thread-safety: one thread at a time; parameters must not be used by other threads meanwhile.

#ifndef LOCKSTEP_ADMISSION_GRADIENT_STAGING_H_
#define LOCKSTEP_ADMISSION_GRADIENT_STAGING_H_

#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "admission/recovery.h"

namespace lockstep {
namespace admission {

// Stages an attempt's contribution to a set of parameters' .grad (see the top of this file).
class GradientStaging : public ContributionStaging {
 public:
  // Stages the gradients of `parameters` (tensors that require grad).
  explicit GradientStaging(std::vector<at::Tensor> parameters);

  // kFailedPrecondition if an attempt is already staged.
  absl::Status Begin() override;
  // kFailedPrecondition without Begin; LibTorch errors (out of memory in the addition) as
  // statuses, in which case the accumulated gradients are restored as they were.
  absl::Status Commit() override;
  void Discard() override;

 private:
  std::vector<at::Tensor> parameters_;
  std::vector<at::Tensor> accumulated_;
  bool staged_ = false;
};

}  // namespace admission
}  // namespace lockstep

#endif  // LOCKSTEP_ADMISSION_GRADIENT_STAGING_H_
