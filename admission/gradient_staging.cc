#include "admission/gradient_staging.h"

#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/torch_boundary.h"

namespace lockstep {
namespace admission {

GradientStaging::GradientStaging(std::vector<at::Tensor> parameters)
    : parameters_(std::move(parameters)) {}

absl::Status GradientStaging::Begin() {
  if (staged_) {
    return absl::FailedPreconditionError("gradient staging: an attempt is already staged");
  }
  accumulated_.clear();
  for (at::Tensor& p : parameters_) {
    accumulated_.push_back(p.grad());
    p.mutable_grad() = at::Tensor();
  }
  staged_ = true;
  return absl::OkStatus();
}

absl::Status GradientStaging::Commit() {
  if (!staged_) return absl::FailedPreconditionError("gradient staging: Commit without Begin");
  std::vector<at::Tensor> sums(parameters_.size());
  absl::Status added = CallTorch("adding a microbatch's gradients to the accumulated ones", [&] {
    for (size_t i = 0; i < parameters_.size(); ++i) {
      const at::Tensor fresh = parameters_[i].grad();
      if (!accumulated_[i].defined()) {
        sums[i] = fresh;
      } else if (!fresh.defined()) {
        sums[i] = accumulated_[i];
      } else {
        sums[i] = accumulated_[i] + fresh;
      }
    }
  });
  if (!added.ok()) {
    Discard();
    return added;
  }
  for (size_t i = 0; i < parameters_.size(); ++i) parameters_[i].mutable_grad() = sums[i];
  accumulated_.clear();
  staged_ = false;
  return absl::OkStatus();
}

void GradientStaging::Discard() {
  if (!staged_) return;
  for (size_t i = 0; i < parameters_.size(); ++i) parameters_[i].mutable_grad() = accumulated_[i];
  accumulated_.clear();
  staged_ = false;
}

}  // namespace admission
}  // namespace lockstep
