#include "trainer/internal/shard_inputs.h"

#include "ATen/ATen.h"
#include "base/torch_boundary.h"
#include "c10/core/impl/VirtualGuardImpl.h"
#include "trainer/internal/device_rows.h"

namespace lockstep {
namespace trainer {
namespace internal {
namespace {

// Up to this many runs, the rows are copied run by run (a strided copy or a concatenation of
// views); beyond it, listing every row for one index_select costs less than a launch per run.
constexpr int64_t kMaxRunCopies = 64;

}  // namespace

void RowOffsets(const std::vector<planner::Sequence>& batch, std::vector<int64_t>& offsets) {
  offsets.assign(batch.size() + 1, 0);
  for (size_t b = 0; b < batch.size(); ++b) offsets[b + 1] = offsets[b] + batch[b].num_tokens;
}

void ShardRowRuns(const planner::Microbatch& mb, const std::vector<planner::ShardPiece>& mine,
                  const std::vector<int64_t>& row_offset, RowRuns& runs) {
  runs.clear();
  for (const planner::ShardPiece& p : mine) {
    const int64_t count = p.end - p.begin;
    const int64_t first_row = CallerRow(mb, row_offset, p.sequence, p.begin);
    if (!runs.empty() && runs.back().first + runs.back().second == first_row) {
      runs.back().second += count;
    } else {
      runs.emplace_back(first_row, count);
    }
  }
}

at::Tensor SelectRows(const at::Tensor& rows, const RowRuns& runs, std::vector<int64_t>& scratch) {
  if (runs.size() <= 1) {
    // One run (a single sequence, or sequences packed in input order, without CP), or none: a
    // view, not a copy; all the rows are `rows` itself, without even a narrow.
    if (runs.empty()) return rows.narrow(0, 0, 0);
    if (runs[0].first == 0 && runs[0].second == rows.size(0)) return rows;
    return rows.narrow(0, runs[0].first, runs[0].second);
  }
  if (std::optional<at::Tensor> copied = CopyRunsOnDevice(rows, runs)) return *std::move(copied);
  if (static_cast<int64_t>(runs.size()) <= kMaxRunCopies) {
    // Runs of one length at one spacing (a sequence's two CP chunks are) are one strided view
    // copied once; other runs one concatenation of views (one launch however many runs).
    const int64_t count = runs[0].second;
    const int64_t spacing = runs[1].first - runs[0].first;
    bool regular = rows.is_contiguous() && count > 0 && spacing >= count;
    for (size_t r = 1; r < runs.size() && regular; ++r) {
      regular = runs[r].second == count && runs[r].first - runs[r - 1].first == spacing;
    }
    if (regular) {
      std::vector<int64_t> size = {static_cast<int64_t>(runs.size()), count};
      std::vector<int64_t> stride = {spacing * rows.stride(0), rows.stride(0)};
      for (int64_t d = 1; d < rows.dim(); ++d) {
        size.push_back(rows.size(d));
        stride.push_back(rows.stride(d));
      }
      std::vector<int64_t> shape = rows.sizes().vec();
      shape[0] = static_cast<int64_t>(runs.size()) * count;
      return rows.as_strided(size, stride, rows.storage_offset() + runs[0].first * rows.stride(0))
          .contiguous()
          .view(shape);
    }
    std::vector<at::Tensor> views;
    views.reserve(runs.size());
    for (const auto& [first, rows_in_run] : runs) {
      views.push_back(rows.narrow(0, first, rows_in_run));
    }
    return at::cat(views, 0);
  }
  // Many runs (short sequences): one gather over the listed rows.
  scratch.clear();
  for (const auto& [first, count] : runs) {
    for (int64_t i = 0; i < count; ++i) scratch.push_back(first + i);
  }
  return rows.index_select(0, at::tensor(scratch, at::kLong).to(rows.device()));
}

c10::Stream CurrentStreamOf(const at::Tensor& tensor) {
  return c10::impl::VirtualGuardImpl(tensor.device().type()).getStream(tensor.device());
}

void PrefetchedShard::Prefetch(const planner::Plan& plan,
                               const std::vector<planner::Sequence>& batch, const at::Tensor& rows,
                               int cp_rank) {
  prefetched_.reset();
  if (plan.microbatches_size() == 0 || !rows.is_cuda()) return;
  absl::StatusOr<std::vector<planner::ShardPiece>> mine = planner::ShardPieces(plan, 0, cp_rank);
  if (!mine.ok()) return;  // the microbatch's attempt reports it
  Prefetched prefetch;
  prefetch.rows = rows;
  prefetch.version = rows._version();
  prefetch.stream = CurrentStreamOf(rows);
  RowOffsets(batch, row_offset_);
  ShardRowRuns(plan.microbatches(0), *mine, row_offset_, prefetch.runs);
  if (prefetch.runs.size() <= 1) return;  // a view: nothing to copy ahead
  if (CallTorch("prefetching the shard's inputs", [&] {
        prefetch.inputs = SelectRows(rows, prefetch.runs, scratch_);
      }).ok()) {
    prefetched_ = std::move(prefetch);
  }
}

std::optional<at::Tensor> PrefetchedShard::Take(const at::Tensor& rows, const RowRuns& runs) {
  std::optional<at::Tensor> taken;
  if (prefetched_.has_value() && prefetched_->rows.is_same(rows) &&
      prefetched_->version == rows._version() && prefetched_->runs == runs &&
      prefetched_->stream == CurrentStreamOf(rows)) {
    taken = std::move(prefetched_->inputs);
  }
  prefetched_.reset();
  return taken;
}

}  // namespace internal
}  // namespace trainer
}  // namespace lockstep
