#include "trainer/shard_work.h"

#include <algorithm>
#include <numeric>

#include "ATen/ATen.h"
#include "base/torch_boundary.h"
#include "checkpoint/checkpoint.h"

namespace lockstep {
namespace trainer {

absl::StatusOr<std::vector<at::Tensor>> ShardWork::RunBlock(
    const Block& block, const std::vector<at::Tensor>& inputs) const {
  if (!block) return absl::InvalidArgumentError("RunBlock: the block is empty");
  if (recompute_streams_ == nullptr) {
    return CallTorch("running a model block",
                     [&]() -> absl::StatusOr<std::vector<at::Tensor>> { return block(inputs); });
  }
  checkpoint::CheckpointOptions options;
  options.rng_streams = recompute_streams_;
  return checkpoint::Checkpoint(block, inputs, options);
}

template <typename First>
at::Tensor ShardWork::PerToken(const First& first, bool counting) const {
  int64_t tokens = 0;
  for (const planner::ShardPiece& p : pieces_) tokens += p.end - p.begin;
  at::Tensor values = at::empty({tokens}, at::kLong);
  int64_t* out = values.data_ptr<int64_t>();
  for (const planner::ShardPiece& p : pieces_) {
    const int64_t count = p.end - p.begin;
    if (counting) {
      std::iota(out, out + count, first(p));
    } else {
      std::fill(out, out + count, first(p));
    }
    out += count;
  }
  return values;
}

const at::Tensor& ShardWork::packed_offsets() const {
  if (!packed_offsets_.defined()) {
    packed_offsets_ = PerToken([](const planner::ShardPiece& p) { return p.begin; }, true);
  }
  return packed_offsets_;
}

const at::Tensor& ShardWork::sequence_ids() const {
  if (!sequence_ids_.defined()) {
    const planner::Microbatch& mb = plan->microbatches(microbatch);
    sequence_ids_ =
        PerToken([&](const planner::ShardPiece& p) { return mb.sequence_id(p.sequence); }, false);
  }
  return sequence_ids_;
}

const at::Tensor& ShardWork::positions() const {
  if (!positions_.defined()) {
    const planner::Microbatch& mb = plan->microbatches(microbatch);
    positions_ = PerToken(
        [&](const planner::ShardPiece& p) {
          return planner::PositionInSequence(mb, p.sequence, p.begin);
        },
        true);
  }
  return positions_;
}

}  // namespace trainer
}  // namespace lockstep
