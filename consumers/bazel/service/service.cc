#include "service/service.h"

#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "checkpoint/checkpoint.h"
#include "rng/model_stream.h"
#include "rng/synchronize.h"

namespace service {

namespace planner = lockstep::planner;
namespace rng = lockstep::rng;

absl::StatusOr<planner::Plan> PlanStep(absl::Span<const int64_t> lengths, int64_t token_budget,
                                       int cp_size) {
  std::vector<planner::Sequence> batch;
  batch.reserve(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    batch.push_back(planner::Sequence::Of(lengths[i], /*id=*/static_cast<int64_t>(i)));
  }
  return planner::PlanMicrobatches(batch, planner::PlanOptions::Of(token_budget, cp_size));
}

absl::StatusOr<at::Tensor> ModelNoise(rng::RankStreams& streams, int64_t n, c10::Device device) {
  LOCKSTEP_ASSIGN_OR_RETURN(rng::ModelStreamScope scope, rng::ModelStreamScope::Enter(streams));
  LOCKSTEP_ASSIGN_OR_RETURN(
      at::Tensor noise,
      lockstep::CallTorch("drawing model noise", [&]() -> absl::StatusOr<at::Tensor> {
        return at::rand({n}, at::device(device));
      }));
  LOCKSTEP_RETURN_IF_ERROR(scope.Exit());
  return noise;
}

absl::StatusOr<at::Tensor> SynchronizedDraw(lockstep::collectives::Communicator* group,
                                            const rng::RankStreams& streams, int64_t n) {
  LOCKSTEP_RETURN_IF_ERROR(rng::Synchronize(group, streams));
  return lockstep::CallTorch("drawing synchronized numbers",
                             [&]() -> absl::StatusOr<at::Tensor> { return at::rand({n}); });
}

absl::StatusOr<at::Tensor> CheckpointedDropout(const at::Tensor& x, double p) {
  const lockstep::checkpoint::CheckpointedFunction block = [p](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{at::dropout(in[0], p, /*train=*/true)};
  };
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> out,
                            lockstep::checkpoint::Checkpoint(block, {x}));
  return std::move(out.at(0));
}

}  // namespace service
