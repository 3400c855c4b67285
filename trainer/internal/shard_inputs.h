// trainer/internal/shard_inputs.h  (private to trainer/)
//
// Selecting a CP shard's input rows from the caller's TrainerInputs::rows: the shard's pieces as
// runs of the caller's rows, and the rows themselves — a view for one run, one copy per run on a
// GPU (device_rows.h), a strided copy for runs of one length at one spacing (a sequence's two CP
// chunks), a concatenation for a few other runs, an index_select for many. Everything here runs
// before the model's forward, so its host time idles the GPU: each path is the cheapest that
// keeps the selected rows in the autograd graph when the caller's rows require gradients.
//
// Also the prefetch of the first microbatch's shard (PrefetchedShard), queued right after
// planning so that the copy overlaps the plan agreement on a GPU.
//
// Thread-safety: as TrainerRank's (one thread).

#ifndef LOCKSTEP_TRAINER_INTERNAL_SHARD_INPUTS_H_
#define LOCKSTEP_TRAINER_INTERNAL_SHARD_INPUTS_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "c10/core/Stream.h"
#include "planner/plan.pb.h"
#include "planner/planner.h"

namespace lockstep {
namespace trainer {
namespace internal {

using RowRuns = std::vector<std::pair<int64_t, int64_t>>;  // (first caller row, rows)

// The first row of each sequence of `batch` in the caller's rows (and the total at the end).
void RowOffsets(const std::vector<planner::Sequence>& batch, std::vector<int64_t>& offsets);

// The caller's row of packed token `t` of packed sequence `k` of `mb`; `row_offset[b]`: the first
// row of sequence b of the batch (RowOffsets).
inline int64_t CallerRow(const planner::Microbatch& mb, const std::vector<int64_t>& row_offset,
                         int k, int64_t t) {
  return row_offset[mb.batch_index(k)] + planner::PositionInSequence(mb, k, t);
}

// The caller's rows of the shard `mine` of microbatch `mb` as runs of consecutive rows (a piece,
// or pieces that follow one another in the caller's inputs).
void ShardRowRuns(const planner::Microbatch& mb, const std::vector<planner::ShardPiece>& mine,
                  const std::vector<int64_t>& row_offset, RowRuns& runs);

// The rows `runs` of `rows`, in order; `scratch` is reused for a listed index. Throws c10::Error.
at::Tensor SelectRows(const at::Tensor& rows, const RowRuns& runs, std::vector<int64_t>& scratch);

// The current stream of `tensor`'s device (the one its work is queued on).
c10::Stream CurrentStreamOf(const at::Tensor& tensor);

// The first microbatch's shard inputs, selected ahead of the forward on a GPU. Taken only for the
// same rows tensor, unchanged since (its version counter), the same runs and the same stream the
// copy was queued on; dropped otherwise.
class PrefetchedShard {
 public:
  // Selects microbatch 0's shard of `cp_rank` from `rows` when they are on a GPU and the shard
  // is not one run (a view needs no copy ahead). Best effort: on any failure nothing is kept and
  // the microbatch's own attempt selects its rows (its outcome agreed by the group).
  void Prefetch(const planner::Plan& plan, const std::vector<planner::Sequence>& batch,
                const at::Tensor& rows, int cp_rank);

  // The prefetched inputs if they are `runs` of `rows` on the current stream; nullopt otherwise.
  // Either way nothing stays prefetched.
  std::optional<at::Tensor> Take(const at::Tensor& rows, const RowRuns& runs);

 private:
  struct Prefetched {
    at::Tensor rows;
    int64_t version = 0;                // the rows' version counter then
    std::optional<c10::Stream> stream;  // the stream the copy was queued on
    RowRuns runs;
    at::Tensor inputs;
  };
  std::optional<Prefetched> prefetched_;
  std::vector<int64_t> row_offset_, scratch_;
};

}  // namespace internal
}  // namespace trainer
}  // namespace lockstep

#endif  // LOCKSTEP_TRAINER_INTERNAL_SHARD_INPUTS_H_
