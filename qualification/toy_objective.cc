#include "qualification/toy_objective.h"

#include <cmath>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "planner/planner.h"

namespace lockstep {
namespace qualification {

absl::StatusOr<ToyObjective> ToyObjective::Create(int features, int seed) {
  if (features < 1) {
    return absl::InvalidArgumentError(absl::StrCat("toy objective: ", features, " features"));
  }
  at::Tensor weight;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("creating the toy objective", [&] {
    weight = at::cos(at::arange(features, at::kDouble) * 0.3 + seed).set_requires_grad(true);
  }));
  return ToyObjective(std::move(weight));
}

absl::Status ToyObjective::RunWave(const admission::WaveWork& work, int cp_rank) {
  const planner::Plan& plan = *work.plan;
  const int64_t features = weight_.numel();
  for (int m : work.microbatches) {
    const planner::Microbatch& mb = plan.microbatches(m);
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<int64_t> owned,
                              planner::ShardTokenIndices(plan, m, cp_rank));
    if (owned.empty()) continue;
    std::vector<double> inputs, targets, weights;
    int k = 0;
    for (int64_t offset : owned) {
      while (offset >= mb.cu_seqlens(k + 1)) ++k;
      const double s = mb.batch_index(k);
      const double t = static_cast<double>(planner::TokenBegin(mb, k) + offset - mb.cu_seqlens(k));
      for (int64_t f = 0; f < features; ++f) {
        inputs.push_back(std::sin(0.7 * static_cast<double>(f) + 1.3 * s + 0.11 * t));
      }
      targets.push_back(std::cos(s + 0.05 * t));
      weights.push_back(planner::LossScale(mb, k));
    }
    LOCKSTEP_RETURN_IF_ERROR(CallTorch(absl::StrCat("toy forward/backward of microbatch ", m), [&] {
      const int64_t n = static_cast<int64_t>(targets.size());
      const auto f64 = at::TensorOptions().dtype(at::kDouble);
      at::Tensor x = at::from_blob(inputs.data(), {n, features}, f64);
      at::Tensor y = at::from_blob(targets.data(), {n}, f64);
      at::Tensor w = at::from_blob(weights.data(), {n}, f64);
      at::Tensor residual = at::mv(x, weight_) - y;
      at::Tensor loss = (w * residual * residual).sum();
      loss.backward();
    }));
  }
  return absl::OkStatus();
}

double MaxRelativeDifference(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor diff = (a - b).abs();
  at::Tensor scale = b.abs().clamp_min(1e-300);
  return (diff / scale).max().item<double>();
}

}  // namespace qualification
}  // namespace lockstep
