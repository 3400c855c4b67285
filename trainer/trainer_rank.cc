#include "trainer/trainer_rank.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>
#include <utility>

#include "ATen/ATen.h"
#include "ATen/core/grad_mode.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "admission/admission.h"
#include "admission/recovery.h"
#include "base/file_io.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "c10/core/Event.h"
#include "c10/core/Stream.h"
#include "c10/core/StreamGuard.h"
#include "c10/core/impl/VirtualGuardImpl.h"
#include "collectives/agreement.h"
#include "numerics/safetensors.h"
#include "planner/plan_agreement.h"
#include "rng/model_stream.h"
#include "rng/resume_state.h"
#include "rng/snapshot.h"
#include "rng/synchronize.h"
#include "torch/csrc/autograd/custom_function.h"
#include "torch/optim/optimizer.h"
#include "torch/serialize.h"

#if LOCKSTEP_BUILT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "c10/cuda/CUDAException.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"
#endif

namespace lockstep {
namespace trainer {
namespace {

// A model-stream scope, or none when the negative-control switch turns scopes off.
absl::StatusOr<std::optional<rng::ModelStreamScope>> EnterModelStream(rng::RankStreams& streams,
                                                                      bool enabled) {
  if (!enabled) return std::optional<rng::ModelStreamScope>();
  LOCKSTEP_ASSIGN_OR_RETURN(rng::ModelStreamScope scope, rng::ModelStreamScope::Enter(streams));
  return std::optional<rng::ModelStreamScope>(std::move(scope));
}

absl::Status ExitModelStream(std::optional<rng::ModelStreamScope>& scope) {
  return scope.has_value() ? scope->Exit() : absl::OkStatus();
}

at::Tensor Int64Tensor(const std::vector<int64_t>& values) { return at::tensor(values, at::kLong); }

// Up to this many shard pieces in a microbatch (over all CP ranks), the gathered outputs are
// assembled by one copy per piece; beyond it, by one index_select (a kernel launch per piece
// would cost more than listing every token).
constexpr int64_t kMaxPieceCopies = 64;

// Up to this many runs of rows, a contiguous CUDA input outside autograd is selected by one
// cudaMemcpyAsync per run (CopyRunsOnDevice); beyond, each copy's few microseconds of host and
// device time add up past ATen's one kernel.
constexpr size_t kMaxRunMemcpys = 8;

// An output tensor already filled (outside autograd); not an input of the graph.
struct Filled {
  at::Tensor full;
};

// The full outputs of a microbatch as a differentiable function of this rank's forward output
// `local`: forward hands back `filled.full` (every rank's rows, already in place), backward gives
// `local` the gradient of its own rows, which lie in `full` as the runs `own_runs` ((first row,
// rows) pairs, in `local`'s order). One node whatever the number of runs, and always in the
// graph, even for an empty shard (a zero-row gradient): every rank's backward then runs the same
// blocks, and their collectives.
class AssembledOutputs : public torch::autograd::Function<AssembledOutputs> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& local,
                            Filled filled, const std::vector<int64_t>& own_runs) {
    ctx->saved_data["own_runs"] = c10::IValue(own_runs);
    ctx->saved_data["local_shape"] = c10::IValue(local.sizes().vec());
    return filled.full;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor& grad = grads[0];
    if (!grad.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const std::vector<int64_t> runs = ctx->saved_data["own_runs"].toIntVector();
    std::vector<at::Tensor> pieces;
    for (size_t i = 0; i + 1 < runs.size(); i += 2) {
      pieces.push_back(grad.narrow(0, runs[i], runs[i + 1]));
    }
    at::Tensor local_grad;
    if (pieces.empty()) {
      local_grad = at::zeros(ctx->saved_data["local_shape"].toIntVector(), grad.options());
    } else if (pieces.size() == 1) {
      local_grad = pieces[0];
    } else {
      local_grad = at::cat(pieces, 0);
    }
    return {local_grad, at::Tensor(), at::Tensor()};
  }
};

// The current stream of `tensor`'s device (the one its work is queued on).
c10::Stream CurrentStreamOf(const at::Tensor& tensor) {
  return c10::impl::VirtualGuardImpl(tensor.device().type()).getStream(tensor.device());
}

using RowRuns = std::vector<std::pair<int64_t, int64_t>>;  // (first caller row, rows)

// The position in its sequence of packed token `t` of packed sequence `k` of `mb`.
int64_t SequencePosition(const planner::Microbatch& mb, int k, int64_t t) {
  return planner::TokenBegin(mb, k) + (t - mb.cu_seqlens(k));
}

// The caller's row of packed token `t` of packed sequence `k` of `mb`; `row_offset[b]`: the first
// row of sequence b of the batch.
int64_t CallerRow(const planner::Microbatch& mb, const std::vector<int64_t>& row_offset, int k,
                  int64_t t) {
  return row_offset[mb.batch_index(k)] + SequencePosition(mb, k, t);
}

// The caller's rows of the shard `mine` of microbatch `mb` as runs of consecutive rows (a piece,
// or pieces that follow one another in the caller's inputs). `row_offset[b]`: the first row of
// sequence b of the batch.
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

#if LOCKSTEP_BUILT_WITH_CUDA
// The rows `runs` of `rows` (a contiguous CUDA tensor) copied by one cudaMemcpyAsync per run on
// the device's current stream, where ATen would queue its copy. Before the forward this host
// time idles the GPU: for a CP2 shard (two runs) on one H200 shared by the CP pair over Gloo, the
// first shard's selection took 103-107 us of host time for 64 MB of float32 against 143-163 us
// through ATen's strided copy (its dispatched calls on cold caches), 45-54 us for 32 MB of
// bfloat16 against 116 us, and the 64 MB copy 41 us of device time against 56 us. Outside
// autograd only: the copy is not in the graph.
at::Tensor CopyRunsOnDevice(const at::Tensor& rows, const RowRuns& runs) {
  const c10::cuda::CUDAGuard on_device(rows.device());
  std::vector<int64_t> shape = rows.sizes().vec();
  shape[0] = 0;
  for (const auto& run : runs) shape[0] += run.second;
  at::Tensor out = at::empty(shape, rows.options());
  int64_t row_elements = 1;
  for (int64_t d = 1; d < rows.dim(); ++d) row_elements *= rows.size(d);
  const size_t row_bytes = static_cast<size_t>(row_elements) * rows.element_size();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(rows.device().index()).stream();
  const char* from = static_cast<const char*>(rows.data_ptr());
  char* to = static_cast<char*>(out.data_ptr());
  for (const auto& [first, count] : runs) {
    const size_t bytes = static_cast<size_t>(count) * row_bytes;
    if (bytes == 0) continue;
    C10_CUDA_CHECK(cudaMemcpyAsync(to, from + static_cast<size_t>(first) * row_bytes, bytes,
                                   cudaMemcpyDeviceToDevice, stream));
    to += bytes;
  }
  return out;
}
#endif

// The rows `runs` of `rows`, in order. Throws c10::Error.
at::Tensor SelectRows(const at::Tensor& rows, const RowRuns& runs, std::vector<int64_t>& scratch) {
  if (runs.size() <= 1) {
    // One run (a single sequence, or sequences packed in input order, without CP), or none: a
    // view, not a copy; all the rows are `rows` itself (each ATen call before the forward costs
    // ~20 us of host time on an H200 host's cold caches, a narrow included).
    if (runs.empty()) return rows.narrow(0, 0, 0);
    if (runs[0].first == 0 && runs[0].second == rows.size(0)) return rows;
    return rows.narrow(0, runs[0].first, runs[0].second);
  }
#if LOCKSTEP_BUILT_WITH_CUDA
  if (runs.size() <= kMaxRunMemcpys && rows.is_cuda() && rows.is_contiguous() &&
      !(at::GradMode::is_enabled() && rows.requires_grad())) {
    return CopyRunsOnDevice(rows, runs);
  }
#endif
  if (static_cast<int64_t>(runs.size()) <= kMaxPieceCopies) {
    // A few runs (CP's chunks of long sequences): copied without listing every row or uploading
    // an index. The copy's host time is spent before the model's forward, so runs of one length
    // at one spacing (a sequence's two CP chunks are) are one strided view copied once (~55 us
    // of host time on an H200 host, against ~90 us for a concatenation of the two), and other
    // runs one concatenation of views (one launch however many runs).
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
    for (const auto& [first, rows_in_run] : runs)
      views.push_back(rows.narrow(0, first, rows_in_run));
    return at::cat(views, 0);
  }
  // Many runs (short sequences): one gather over the listed rows.
  scratch.clear();
  for (const auto& [first, count] : runs) {
    for (int64_t i = 0; i < count; ++i) scratch.push_back(first + i);
  }
  return rows.index_select(0, Int64Tensor(scratch).to(rows.device()));
}

// The first row of each sequence of `batch` (and the total at the end).
void RowOffsets(const std::vector<planner::Sequence>& batch, std::vector<int64_t>& offsets) {
  offsets.assign(batch.size() + 1, 0);
  for (size_t b = 0; b < batch.size(); ++b) offsets[b + 1] = offsets[b] + batch[b].num_tokens;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainerRank>> TrainerRank::Create(const TrainerConfig& config,
                                                                 Collaborators collaborators,
                                                                 ForwardAdapter forward) {
  const collectives::Topology& topology = collaborators.topology;
  if (collaborators.streams == nullptr) {
    return absl::InvalidArgumentError("trainer: no RankStreams given");
  }
  if (!forward) return absl::InvalidArgumentError("trainer: no forward adapter given");
  if (config.max_tokens_per_microbatch < 2 * topology.cp_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer: max_tokens_per_microbatch ", config.max_tokens_per_microbatch,
                     " is below 2 x CP size (", 2 * topology.cp_size(), ")"));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::Coordinates mine,
                            topology.CoordinatesOf(collaborators.world_rank));
  const std::vector<int> expected = topology.TpCpGroup(collaborators.world_rank);
  std::vector<int> members = {collaborators.world_rank};
  if (collaborators.tp_cp_group != nullptr) members = collaborators.tp_cp_group->global_ranks();
  if (members != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer: rank ", collaborators.world_rank, "'s group holds global ranks [",
        absl::StrJoin(members, ", "), "], not its TP x CP group [", absl::StrJoin(expected, ", "),
        "]", collaborators.tp_cp_group == nullptr ? " (no group given)" : ""));
  }
  // The first group member of each CP rank: its gathered shard is the one read (TP replicas of a
  // CP rank hold the same rows).
  std::vector<int> cp_holders(topology.cp_size(), -1);
  for (size_t g = 0; g < members.size(); ++g) {
    LOCKSTEP_ASSIGN_OR_RETURN(collectives::Coordinates c, topology.CoordinatesOf(members[g]));
    if (cp_holders[c.cp] < 0) cp_holders[c.cp] = static_cast<int>(g);
  }
  std::unique_ptr<TrainerRank> trainer(new TrainerRank(
      config, std::move(collaborators), std::move(forward), mine.cp, std::move(cp_holders)));
  if (config.ledger != nullptr) {
    // Step numbers go on from the last step this rank's ledger began (committed or not: an
    // interrupted call keeps its record).
    trainer->next_ledger_step_ = config.ledger->last_begun_step() + 1;
  }
  if (config.activation_checkpointing) {
    trainer->recompute_streams_ = checkpoint::StreamSnapshots::Of(trainer->collaborators_.streams);
  }
  // Before any scope: the model stream is derived from the synchronized caller state, so it
  // agrees across the replicas.
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(trainer->SynchronizeCaller(),
                                        trainer->Where("creating the trainer"));
  return trainer;
}

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
        [&](const planner::ShardPiece& p) { return SequencePosition(mb, p.sequence, p.begin); },
        true);
  }
  return positions_;
}

std::string TrainerRank::Where(absl::string_view operation) const {
  return absl::StrCat("trainer rank ", collaborators_.world_rank, ": ", operation);
}

absl::Status TrainerRank::SynchronizeCaller() {
  if (!config_.synchronize_caller) return absl::OkStatus();
  return rng::Synchronize(collaborators_.tp_cp_group, *collaborators_.streams);
}

absl::StatusOr<planner::Plan> TrainerRank::Plan(const TrainerInputs& inputs) {
  int64_t tokens = 0;
  for (const planner::Sequence& s : inputs.sequences) tokens += s.num_tokens;
  if (!inputs.rows.defined() || inputs.rows.dim() < 1 || inputs.rows.size(0) != tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where("planning"), ": the input rows (",
        inputs.rows.defined() ? absl::StrCat(inputs.rows.dim() >= 1 ? inputs.rows.size(0) : 0)
                              : "undefined",
        ") must have one row per token of the sequences (", tokens, ")"));
  }
  planner::PlanOptions options;
  options.max_tokens_per_microbatch = config_.max_tokens_per_microbatch;
  options.cp_size = cp_size();
  options.packing = config_.packing;
  options.loss_normalization = config_.loss_normalization;
  LOCKSTEP_ASSIGN_OR_RETURN(planner::Plan plan,
                            planner::PlanMicrobatches(inputs.sequences, options));
  PrefetchFirstShard(plan, inputs);
  if (Replicas() != nullptr) {
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(planner::CheckPlanAgreement(*Replicas(), plan),
                                          Where("plan agreement"));
  }
  return plan;
}

void TrainerRank::PrefetchFirstShard(const planner::Plan& plan, const TrainerInputs& inputs) {
  prefetched_.reset();
  if (plan.microbatches_size() == 0 || !inputs.rows.is_cuda()) return;
  absl::StatusOr<std::vector<planner::ShardPiece>> mine = planner::ShardPieces(plan, 0, cp_rank_);
  if (!mine.ok()) return;  // RunMicrobatch reports it
  PrefetchedInputs prefetch;
  prefetch.rows = inputs.rows;
  prefetch.version = inputs.rows._version();
  prefetch.stream = CurrentStreamOf(inputs.rows);
  RowOffsets(inputs.sequences, scratch_.row_offset);
  ShardRowRuns(plan.microbatches(0), *mine, scratch_.row_offset, prefetch.runs);
  if (prefetch.runs.size() <= 1) return;  // a view: nothing to copy ahead
  // Best effort: a failure (out of memory) is left to the microbatch's own attempt, whose
  // outcome the group agrees on.
  if (CallTorch("prefetching the shard's inputs", [&] {
        prefetch.inputs = SelectRows(inputs.rows, prefetch.runs, scratch_.my_rows);
      }).ok()) {
    prefetched_ = std::move(prefetch);
  }
}

absl::StatusOr<MicrobatchOutput> TrainerRank::RunMicrobatch(
    const planner::Plan& plan, int m, const TrainerInputs& inputs, const internal::LedgerCall& call,
    const std::function<absl::Status()>& before_gather) {
  const std::string where = Where(absl::StrCat("microbatch ", m));
  const planner::Microbatch& mb = plan.microbatches(m);
  // Everything per token is written range by range from the shard's pieces (a few per packed
  // sequence), and only what the model's forward reads is built before it is called: on a GPU the
  // rest (the rows and loss weights handed back, the gather's index) runs while the forward's
  // kernels do. Measured on an H200 host: per-token lists built before the forward cost ~1.1 ms
  // of a 6.3 ms microbatch of 65,536 tokens.
  std::vector<int64_t>& row_offset = scratch_.row_offset;
  RowOffsets(inputs.sequences, row_offset);
  std::vector<std::vector<planner::ShardPiece>> pieces(cp_size());
  std::vector<int64_t> shard_tokens(cp_size(), 0);
  for (int c = 0; c < cp_size(); ++c) {
    LOCKSTEP_ASSIGN_OR_RETURN(pieces[c], planner::ShardPieces(plan, m, c));
    for (const planner::ShardPiece& p : pieces[c]) shard_tokens[c] += p.end - p.begin;
  }
  const std::vector<planner::ShardPiece>& mine = pieces[cp_rank_];
  const int64_t my_tokens = shard_tokens[cp_rank_];

  ShardWork work;
  work.plan = &plan;
  work.microbatch = m;
  work.cp_rank = cp_rank_;
  work.cp_size = cp_size();
  work.forward_index = forward_index_++;
  work.recompute_streams_ = recompute_streams_;
  work.widest_shard = *std::max_element(shard_tokens.begin(), shard_tokens.end());
  work.pieces_ = mine;
  MicrobatchOutput out;
  out.microbatch = m;
  const absl::Status selected = CallTorch("selecting the shard's inputs", [&] {
    RowRuns& runs = scratch_.row_runs;
    ShardRowRuns(mb, mine, row_offset, runs);
    // Taken only for the same rows, unchanged since (their version), and the same stream, which
    // the copy was queued on.
    if (prefetched_.has_value() && prefetched_->rows.is_same(inputs.rows) &&
        prefetched_->version == inputs.rows._version() && prefetched_->runs == runs &&
        prefetched_->stream == CurrentStreamOf(inputs.rows)) {
      work.inputs = std::move(prefetched_->inputs);
    } else {
      work.inputs = SelectRows(inputs.rows, runs, scratch_.my_rows);
    }
    prefetched_.reset();
  });
  // A failure to select the inputs (out of memory on the device) is this rank's outcome of the
  // forward: the group agrees on it below like on a failed forward.
  const char* const attempt =
      selected.ok() ? "the model's forward" : "selecting the shard's inputs";
  absl::StatusOr<at::Tensor> forwarded = absl::UnknownError("the forward was not called");
  if (selected.ok()) {
    absl::Status thrown = CallTorch("the model's forward", [&] { forwarded = forward_(work); });
    if (!thrown.ok()) forwarded = thrown;
  } else {
    forwarded = selected;
  }
  // The attempt is recorded as started once the forward's kernels are queued (the record is
  // queued too: TrainerConfig::ledger).
  LOCKSTEP_RETURN_IF_ERROR(RecordLedger(call, admission::LedgerEventKind::kStarted, plan, m));
  // What is handed back per token, built while the forward's kernels run.
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<double> weights,
                            planner::TokenLossWeights(mb, inputs.sequences));
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
      CallTorch("listing the microbatch's rows",
                [&] {
                  out.input_rows = at::empty({mb.num_tokens()}, at::kLong);
                  int64_t* rows = out.input_rows.data_ptr<int64_t>();
                  for (int k = 0; k < mb.batch_index_size(); ++k) {
                    std::iota(rows + mb.cu_seqlens(k), rows + mb.cu_seqlens(k + 1),
                              CallerRow(mb, row_offset, k, mb.cu_seqlens(k)));
                  }
                  out.loss_weights = at::tensor(weights, at::kDouble);
                }),
      where);
  if (config_.memory_model != nullptr && Replicas() != nullptr) {
    // The group agrees on the forward's outcome before anyone waits in the gather.
    const bool oom = absl::IsResourceExhausted(forwarded.status());
    absl::StatusOr<admission::GroupOutcome> agreed =
        admission::AgreeOnOutcome(Replicas(), forwarded.status());
    if (!agreed.ok()) {
      return Annotate(agreed.status(), absl::StrCat(where, ": agreeing on the forward's outcome"));
    }
    if (agreed->failed > 0) {
      if (!forwarded.ok() && !oom) {
        return Annotate(forwarded.status(), absl::StrCat(where, ": ", attempt));
      }
      return absl::AbortedError(absl::StrCat(
          where, ": ", agreed->failed, " replica(s) of the TP x CP group failed the forward"));
    }
    if (agreed->out_of_memory > 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat(where, ": out of memory in the forward on ", agreed->out_of_memory,
                       " replica(s) of the group",
                       oom ? absl::StrCat(" (here: ", forwarded.status().message(), ")") : ""));
    }
  }
  if (!forwarded.ok()) return Annotate(forwarded.status(), absl::StrCat(where, ": ", attempt));
  at::Tensor local = *std::move(forwarded);
  if (!local.defined() || local.dim() < 1 || local.size(0) != my_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the forward adapter returned ",
                     local.defined() ? absl::StrCat(local.dim() >= 1 ? local.size(0) : -1) : "no",
                     " rows for ", my_tokens, " tokens"));
  }
  if (before_gather) LOCKSTEP_RETURN_IF_ERROR(before_gather());
  if (collaborators_.tp_cp_group == nullptr || cp_size() == 1) {
    out.outputs = local;
    return out;
  }
  // Gather: every member sends its shard padded to the largest shard of the microbatch (an
  // empty shard sends padding), so all members run the same all-gather.
  const int64_t widest = work.widest_shard;
  // Few pieces (long sequences): the full output is filled by one copy per run of pieces. Many
  // (short sequences): by one index_select over a listed index, built here, before the
  // all-gather waits, while the forward's kernels may still run.
  int64_t piece_count = 0;
  for (const auto& p : pieces) piece_count += static_cast<int64_t>(p.size());
  const bool by_pieces = piece_count <= kMaxPieceCopies;
  // The index (unless by pieces): every packed token's row in the gathered shards, then this
  // rank's own tokens' places, the shard's packed offsets: they go back in with one index_copy,
  // which keeps `local` in the autograd graph even for an empty shard, so that every rank's
  // backward runs the same blocks (and their collectives).
  std::vector<int64_t>& index = scratch_.gather_index;
  if (by_pieces) {
    // Where each packed token range comes from, in token order (the ranks' pieces partition the
    // microbatch).
    std::vector<PieceSource>& sources = scratch_.piece_sources;
    sources.clear();
    for (int c = 0; c < cp_size(); ++c) {
      const int member = c == cp_rank_ ? PieceSource::kOwn : cp_holders_[c];
      int64_t row = 0;
      for (const planner::ShardPiece& p : pieces[c]) {
        sources.push_back(PieceSource{p.begin, p.end - p.begin, member, row});
        row += p.end - p.begin;
      }
    }
    std::sort(sources.begin(), sources.end(),
              [](const PieceSource& x, const PieceSource& y) { return x.begin < y.begin; });
    int64_t covered = 0;
    for (const PieceSource& piece : sources) {
      if (piece.begin != covered) break;
      covered += piece.count;
    }
    // Pieces that continue one another in both the output and their source are one copy.
    size_t runs = 0;
    for (const PieceSource& piece : sources) {
      PieceSource* last = runs > 0 ? &sources[runs - 1] : nullptr;
      if (last != nullptr && last->member == piece.member &&
          last->begin + last->count == piece.begin && last->row + last->count == piece.row) {
        last->count += piece.count;
      } else {
        sources[runs++] = piece;
      }
    }
    sources.resize(runs);
    if (covered != mb.num_tokens()) {
      return absl::InternalError(absl::StrCat(where, ": the CP shards' pieces cover ", covered,
                                              " leading tokens of ", mb.num_tokens(),
                                              " without gap or overlap"));
    }
  } else {
    index.assign(static_cast<size_t>(mb.num_tokens() + my_tokens), 0);
    for (int c = 0; c < cp_size(); ++c) {
      int64_t row = static_cast<int64_t>(cp_holders_[c]) * widest;
      for (const planner::ShardPiece& p : pieces[c]) {
        std::iota(index.data() + p.begin, index.data() + p.end, row);
        row += p.end - p.begin;
      }
    }
    int64_t* own = index.data() + mb.num_tokens();
    for (const planner::ShardPiece& p : mine) {
      std::iota(own, own + (p.end - p.begin), p.begin);
      own += p.end - p.begin;
    }
  }
  at::Tensor padded;
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
      CallTorch("padding the shard",
                [&] {
                  if (local.size(0) == widest && local.is_contiguous()) {
                    padded = local.detach();  // already the widest: sent as it is
                    return;
                  }
                  std::vector<int64_t> shape = local.sizes().vec();
                  shape[0] = widest;
                  padded = at::empty(shape, local.options().requires_grad(false));
                  if (local.size(0) > 0) padded.slice(0, 0, local.size(0)).copy_(local.detach());
                  padded.slice(0, local.size(0)).zero_();
                }),
      where);
  // By pieces, the output is filled run by run: this rank's own runs now, from `local`, while the
  // all-gather runs (on a GPU, on a side stream that waits for the forward), the others' after
  // it. The copies go through `full`, outside autograd; the output handed back is made now, by
  // AssembledOutputs (above), which puts `local` into the graph, so that after the gather only
  // the others' copies remain to be queued.
  at::Tensor full;
  std::optional<c10::Event> own_copied;
  if (by_pieces) {
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
        CallTorch(
            "placing the own rows",
            [&] {
              std::vector<int64_t> shape = local.sizes().vec();
              shape[0] = mb.num_tokens();
              full = at::empty(shape, local.options().requires_grad(false));
              const at::Tensor source = local.detach();
              auto copy_own = [&] {
                for (const PieceSource& run : scratch_.piece_sources) {
                  if (run.member != PieceSource::kOwn) continue;
                  full.narrow(0, run.begin, run.count).copy_(source.narrow(0, run.row, run.count));
                }
              };
              if (!local.is_cuda()) {
                copy_own();
                return;
              }
              const c10::impl::VirtualGuardImpl device(local.device().type());
              const c10::Stream side = device.getStreamFromGlobalPool(local.device());
              c10::Event forward_done(local.device().type());
              forward_done.record(CurrentStreamOf(local));
              forward_done.block(side);
              {
                const c10::StreamGuard on_side(side);
                copy_own();
              }
              // Neither block is reused before the side stream is done with it (even if
              // the all-gather fails and both are dropped).
              device.recordDataPtrOnStream(source.storage().data_ptr(), side);
              device.recordDataPtrOnStream(full.storage().data_ptr(), side);
              own_copied.emplace(local.device().type());
              own_copied->record(side);
            }),
        where);
    std::vector<int64_t> own_runs;  // (row of `full`, rows), in `local`'s order
    for (const PieceSource& run : scratch_.piece_sources) {
      if (run.member != PieceSource::kOwn) continue;
      own_runs.push_back(run.begin);
      own_runs.push_back(run.count);
    }
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(CallTorch("assembling the full outputs",
                                                    [&] {
                                                      // `full` stays a plain tensor for the copies
                                                      // to come; the output shares it.
                                                      const at::Tensor output = full;
                                                      full = full.detach();
                                                      out.outputs = AssembledOutputs::apply(
                                                          local, Filled{output}, own_runs);
                                                    }),
                                          where);
  }
  // By pieces, the others' runs are queued as soon as the all-gather is (AllGatherThen): on a
  // GPU they follow it on the stream instead of waiting for the host to see it complete. The
  // rank's own rows come from `local`, so they stay differentiable while the others are
  // constants.
  auto copy_others = [&](const std::vector<at::Tensor>& gathered) -> absl::Status {
    if (!by_pieces) return absl::OkStatus();
    return CallTorch("assembling the full outputs", [&] {
      // After the own runs (which run beside the all-gather).
      if (own_copied.has_value()) {
        own_copied->block(CurrentStreamOf(local));
      }
      for (const PieceSource& run : scratch_.piece_sources) {
        if (run.member == PieceSource::kOwn) continue;
        full.narrow(0, run.begin, run.count)
            .copy_(gathered[run.member].narrow(0, run.row, run.count));
      }
    });
  };
  absl::StatusOr<std::vector<at::Tensor>> all =
      collaborators_.tp_cp_group->AllGatherThen(padded, copy_others);
  if (!all.ok()) return Annotate(all.status(), absl::StrCat(where, ": gathering the outputs"));
  if (by_pieces) return out;
  const std::vector<at::Tensor>& gathered = *all;
  // The output is [tokens, ...] of the full width, so every pass avoided here is a pass over all
  // of it.
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
      CallTorch(
          "assembling the full outputs",
          [&] {
            // The shards side by side: a view when the communicator returned views of one
            // buffer in member order (NCCL does), else a concatenation.
            const at::Tensor& first = gathered.front();
            bool one_buffer = first.is_contiguous();
            for (size_t g = 0; g < gathered.size() && one_buffer; ++g) {
              one_buffer = gathered[g].is_contiguous() && gathered[g].sizes() == first.sizes() &&
                           gathered[g].storage().is_alias_of(first.storage()) &&
                           gathered[g].storage_offset() ==
                               first.storage_offset() + static_cast<int64_t>(g) * first.numel();
            }
            std::vector<int64_t> shape = first.sizes().vec();
            shape[0] *= static_cast<int64_t>(gathered.size());
            const at::Tensor side_by_side =
                one_buffer ? first.as_strided(shape, c10::contiguous_strides(shape),
                                              first.storage_offset())
                           : at::cat(gathered, 0);
            // A copy even on the CPU: autograd keeps the index for backward, and the
            // scratch list is reused by the next microbatch.
            const at::Tensor device_index =
                at::from_blob(index.data(), {static_cast<int64_t>(index.size())}, at::kLong)
                    .to(padded.device(), at::kLong, /*non_blocking=*/false, /*copy=*/true);
            at::Tensor assembled =
                side_by_side.index_select(0, device_index.narrow(0, 0, mb.num_tokens()));
            assembled.index_copy_(0, device_index.narrow(0, mb.num_tokens(), my_tokens), local);
            out.outputs = assembled;
          }),
      where);
  return out;
}

absl::Status TrainerRank::Admit(const planner::Plan& plan) const {
  if (config_.memory_model == nullptr) return absl::OkStatus();
  admission::AdmissionOptions options;
  options.max_microbatches_per_wave = 1;
  return admission::AdmitWaves(plan, *config_.memory_model, config_.memory_cap_bytes, options)
      .status();
}

absl::Status TrainerRank::BeginLedgerStep(const planner::Plan& plan, internal::LedgerCall& call) {
  if (config_.ledger == nullptr) return absl::OkStatus();
  call.step = next_ledger_step_;
  call.ids.clear();
  for (int m = 0; m < plan.microbatches_size(); ++m) call.ids.push_back(absl::StrCat(m));
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
      config_.ledger->QueueBeginStep(call.step, admission::PlannedWorkOf(plan)),
      Where(absl::StrCat("beginning ledger step ", call.step)));
  ++next_ledger_step_;
  return absl::OkStatus();
}

absl::Status TrainerRank::RecordLedger(const internal::LedgerCall& call,
                                       admission::LedgerEventKind kind, const planner::Plan& plan,
                                       int m, std::string detail) {
  if (config_.ledger == nullptr || call.step < 0) return absl::OkStatus();
  const std::string id = call.ids.at(m);
  return Annotate(config_.ledger->QueueRecord(admission::LedgerEvent::Of(
                      kind, call.step, id, admission::TokenRangesOf(plan, m), std::move(detail))),
                  Where(absl::StrCat("recording microbatch ", id, " of ledger step ", call.step)));
}

absl::Status TrainerRank::CommitLedgerStep(const internal::LedgerCall& call) {
  if (config_.ledger == nullptr || call.step < 0) return absl::OkStatus();
  return Annotate(config_.ledger->QueueCommitStep(call.step),
                  Where(absl::StrCat("committing ledger step ", call.step)));
}

absl::StatusOr<MicrobatchOutput> TrainerRank::RunWithRecovery(
    planner::Plan& plan, std::vector<int>& depth, internal::LedgerCall& call, int m,
    const TrainerInputs& inputs, const std::function<absl::Status()>& before_gather) {
  while (true) {
    // Where the model stream stands before the attempt (only needed to rewind after an agreed
    // out-of-memory outcome, so only with admission).
    std::optional<rng::RngSnapshot> before;
    if (config_.memory_model != nullptr) {
      LOCKSTEP_ASSIGN_OR_RETURN(before,
                                rng::RngSnapshot::Capture(collaborators_.streams->generators()));
    }
    absl::StatusOr<MicrobatchOutput> out = RunMicrobatch(plan, m, inputs, call, before_gather);
    if (out.ok() || config_.memory_model == nullptr || !absl::IsResourceExhausted(out.status())) {
      return out;
    }
    // Agreed out of memory: every replica discards the attempt the same way.
    const std::string where = Where(absl::StrCat("microbatch ", m));
    ++out_of_memory_;
    LOCKSTEP_RETURN_IF_ERROR(RecordLedger(call, admission::LedgerEventKind::kFailed, plan, m,
                                          std::string(out.status().message())));
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(before->Restore(), where);  // the model stream rewinds
    --forward_index_;
    if (config_.memory_probe != nullptr) {
      LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(config_.memory_probe->ReleaseCachedMemory(), where);
    }
    config_.memory_model->CorrectAfterOom(admission::ShapeOfMicrobatch(plan, m),
                                          config_.memory_cap_bytes);
    if (depth[m] >= config_.max_split_depth) {
      return absl::ResourceExhaustedError(
          absl::StrCat(where, ": still out of memory after ", depth[m], " splits (max_split_depth ",
                       config_.max_split_depth, "): ", out.status().message()));
    }
    absl::StatusOr<planner::Plan> split = planner::SplitMicrobatch(plan, m);
    if (!split.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(where,
                                                       ": out of memory and cannot be split "
                                                       "further: ",
                                                       split.status().message()));
    }
    if (call.step >= 0) {
      const std::string id = call.ids[m];
      LOCKSTEP_RETURN_IF_ERROR(RecordLedger(call, admission::LedgerEventKind::kSplit, plan, m,
                                            absl::StrCat("into ", id, ".0 and ", id, ".1")));
      call.ids[m] = absl::StrCat(id, ".1");
      call.ids.insert(call.ids.begin() + m, absl::StrCat(id, ".0"));
    }
    plan = std::move(*split);
    depth.insert(depth.begin() + m, ++depth[m]);
    if (Replicas() != nullptr) {
      LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(planner::CheckPlanAgreement(*Replicas(), plan),
                                            absl::StrCat(where, ": agreeing on the split"));
    }
  }
}

absl::StatusOr<MicrobatchStream> TrainerRank::ForwardMicroBatches(TrainerInputs inputs) {
  rng::RankStreams& streams = *collaborators_.streams;
  if (!streams.caller_state_live()) {
    return absl::FailedPreconditionError(
        Where("ForwardMicroBatches inside a model-stream scope or named-stream fork"));
  }
  planner::Plan plan;
  {
    LOCKSTEP_ASSIGN_OR_RETURN(std::optional<rng::ModelStreamScope> scope,
                              EnterModelStream(streams, config_.model_stream_scope));
    absl::StatusOr<planner::Plan> planned = Plan(inputs);
    LOCKSTEP_RETURN_IF_ERROR(ExitModelStream(scope));
    if (!planned.ok()) return planned.status();
    plan = std::move(*planned);
  }
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(Admit(plan), Where("admission"));
  MicrobatchStream stream(this, std::move(plan), std::move(inputs));
  stream.split_depth_.assign(stream.plan_.microbatches_size(), 0);
  LOCKSTEP_RETURN_IF_ERROR(BeginLedgerStep(stream.plan_, stream.ledger_));
  return stream;
}

absl::StatusOr<std::optional<MicrobatchOutput>> MicrobatchStream::Next() {
  if (failed_ || next_ >= plan_.microbatches_size()) return std::optional<MicrobatchOutput>();
  rng::RankStreams& streams = trainer_->streams();
  absl::StatusOr<MicrobatchOutput> out = [&]() -> absl::StatusOr<MicrobatchOutput> {
    if (!streams.caller_state_live()) {
      return absl::FailedPreconditionError(
          trainer_->Where("Next() inside a model-stream scope or named-stream fork"));
    }
    LOCKSTEP_ASSIGN_OR_RETURN(std::optional<rng::ModelStreamScope> scope,
                              EnterModelStream(streams, trainer_->config_.model_stream_scope));
    // The scope ends, and the caller's state is synchronized across the group (the hand-back
    // point's contract), once the model's forward is queued and its outcome agreed: the gather
    // and the assembly of the outputs draw no random numbers, so both run while the forward's
    // kernels do instead of after the gather.
    bool synchronized = false;
    auto hand_back_rng = [&]() -> absl::Status {
      LOCKSTEP_RETURN_IF_ERROR(ExitModelStream(scope));
      LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
          trainer_->SynchronizeCaller(),
          trainer_->Where(absl::StrCat("synchronizing after microbatch ", next_)));
      synchronized = true;
      return absl::OkStatus();
    };
    absl::StatusOr<MicrobatchOutput> run =
        trainer_->RunWithRecovery(plan_, split_depth_, ledger_, next_, inputs_, hand_back_rng);
    LOCKSTEP_RETURN_IF_ERROR(ExitModelStream(scope));  // a no-op once ended
    if (!run.ok()) return run.status();
    if (!synchronized) LOCKSTEP_RETURN_IF_ERROR(hand_back_rng());
    // Handed back: the microbatch completed; the call's last one commits the step.
    LOCKSTEP_RETURN_IF_ERROR(
        trainer_->RecordLedger(ledger_, admission::LedgerEventKind::kCompleted, plan_, next_));
    if (next_ + 1 == plan_.microbatches_size()) {
      LOCKSTEP_RETURN_IF_ERROR(trainer_->CommitLedgerStep(ledger_));
    }
    return run;
  }();
  if (!out.ok()) {
    failed_ = true;
    return out.status();
  }
  ++next_;
  return std::optional<MicrobatchOutput>(std::move(*out));
}

absl::StatusOr<std::vector<MicrobatchOutput>> TrainerRank::DpRankForward(TrainerInputs inputs) {
  rng::RankStreams& streams = *collaborators_.streams;
  if (!streams.caller_state_live()) {
    return absl::FailedPreconditionError(
        Where("DpRankForward inside a model-stream scope or named-stream fork"));
  }
  std::vector<MicrobatchOutput> outputs;
  planner::Plan plan;
  internal::LedgerCall call;
  {
    LOCKSTEP_ASSIGN_OR_RETURN(std::optional<rng::ModelStreamScope> scope,
                              EnterModelStream(streams, config_.model_stream_scope));
    absl::Status status = [&]() -> absl::Status {
      LOCKSTEP_ASSIGN_OR_RETURN(plan, Plan(inputs));
      LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(Admit(plan), Where("admission"));
      LOCKSTEP_RETURN_IF_ERROR(BeginLedgerStep(plan, call));
      std::vector<int> depth(plan.microbatches_size(), 0);
      for (int m = 0; m < plan.microbatches_size(); ++m) {
        LOCKSTEP_ASSIGN_OR_RETURN(MicrobatchOutput out,
                                  RunWithRecovery(plan, depth, call, m, inputs, nullptr));
        outputs.push_back(std::move(out));
      }
      return absl::OkStatus();
    }();
    LOCKSTEP_RETURN_IF_ERROR(ExitModelStream(scope));
    LOCKSTEP_RETURN_IF_ERROR(status);
  }
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(SynchronizeCaller(),
                                        Where("synchronizing after DpRankForward"));
  // Handed back: every microbatch completed, and the step commits.
  for (int m = 0; m < plan.microbatches_size(); ++m) {
    LOCKSTEP_RETURN_IF_ERROR(RecordLedger(call, admission::LedgerEventKind::kCompleted, plan, m));
  }
  LOCKSTEP_RETURN_IF_ERROR(CommitLedgerStep(call));
  return outputs;
}

absl::StatusOr<std::vector<at::Tensor>> TrainerRank::RegisterCustomObject(
    const std::string& name, const std::string& metadata,
    const std::function<absl::StatusOr<std::vector<at::Tensor>>()>& factory) {
  const std::string where = Where(absl::StrCat("registering custom object '", name, "'"));
  collectives::Communicator* group = collaborators_.tp_cp_group;
  if (group != nullptr) {
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
        collectives::CheckAgreement(*group, "trainer/register_object",
                                    absl::StrCat(name, "\n", metadata)),
        where);
  }
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(SynchronizeCaller(), where);
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> parameters, factory());
  if (group != nullptr) {
    at::AutoGradMode no_grad(false);
    for (at::Tensor& p : parameters) {
      LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(group->Broadcast(p, 0), where);
    }
  }
  return parameters;
}

namespace {

constexpr char kWeightsFile[] = "weights.safetensors";
constexpr char kOptimizerFile[] = "optimizer.pt";
constexpr char kRngFile[] = "rng.bin";
constexpr char kTrainerFile[] = "trainer.txt";

bool Exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, " cannot be opened"));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

}  // namespace

void RemoveSavedState(const std::string& dir) {
  for (const char* name : {kWeightsFile, kOptimizerFile, kRngFile, kTrainerFile}) {
    std::remove(absl::StrCat(dir, "/", name).c_str());
  }
  rmdir(dir.c_str());
}

absl::Status TrainerRank::SaveState(const std::string& dir, const numerics::NamedTensors& weights,
                                    const torch::optim::Optimizer* optimizer,
                                    const SaveOptions& options) {
  const std::string where = Where(absl::StrCat("saving state to ", dir));
  if (!collaborators_.streams->caller_state_live()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": inside a model-stream scope or named-stream fork"));
  }
  if (Exists(dir)) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": it exists; choose a new one"));
  }
  if (config_.ledger != nullptr) {
    // A saved state never follows a step whose record (queued) or commit could still be lost.
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(config_.ledger->AwaitDurable(), where);
  }
  const std::string temp = absl::StrCat(dir, ".saving.", getpid());
  RemoveSavedState(temp);
  if (mkdir(temp.c_str(), 0755) != 0) {
    return absl::InternalError(absl::StrCat(where, ": mkdir ", temp, ": ", strerror(errno)));
  }
  absl::Status status = [&]() -> absl::Status {
    LOCKSTEP_RETURN_IF_ERROR(
        numerics::WriteSafetensors(absl::StrCat(temp, "/", kWeightsFile), weights, {}));
    if (optimizer != nullptr) {
      LOCKSTEP_RETURN_IF_ERROR(CallTorch("saving the optimizer", [&] {
        torch::serialize::OutputArchive archive;
        optimizer->save(archive);
        archive.save_to(absl::StrCat(temp, "/", kOptimizerFile));
      }));
    }
    if (options.include_rng_streams) {
      LOCKSTEP_ASSIGN_OR_RETURN(rng::RngResumeStateProto rng,
                                rng::CaptureResumeState(*collaborators_.streams));
      LOCKSTEP_ASSIGN_OR_RETURN(std::string bytes, rng::SerializeResumeState(rng));
      LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(temp, "/", kRngFile), bytes));
    }
    LOCKSTEP_RETURN_IF_ERROR(
        WriteFileAtomically(absl::StrCat(temp, "/", kTrainerFile),
                            absl::StrCat("forward_index ", forward_index_, "\n")));
    if (rename(temp.c_str(), dir.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("rename ", temp, " to ", dir, ": ", strerror(errno)));
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    RemoveSavedState(temp);
    return Annotate(status, where);
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadReport> TrainerRank::LoadState(const std::string& dir,
                                                  numerics::NamedTensors& weights,
                                                  torch::optim::Optimizer* optimizer) {
  const std::string where = Where(absl::StrCat("loading state from ", dir));
  if (!collaborators_.streams->caller_state_live()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": inside a model-stream scope or named-stream fork"));
  }
  LoadReport report;
  // Everything is read and checked before anything changes.
  LOCKSTEP_ASSIGN_OR_RETURN(numerics::SafetensorsFile file,
                            numerics::SafetensorsFile::Open(absl::StrCat(dir, "/", kWeightsFile)));
  LOCKSTEP_ASSIGN_OR_RETURN(numerics::NamedTensors saved, file.Tensors());
  if (saved.size() != weights.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", saved.size(), " saved weights for ", weights.size(), " given"));
  }
  std::vector<const at::Tensor*> sources;
  for (const auto& entry : weights) {
    const at::Tensor* source = nullptr;
    for (const auto& s : saved) {
      if (s.first == entry.first) source = &s.second;
    }
    if (source == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no saved weight named '", entry.first, "'"));
    }
    if (source->sizes() != entry.second.sizes() ||
        source->scalar_type() != entry.second.scalar_type()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": weight '", entry.first,
                                                     "' was saved with another shape or dtype"));
    }
    sources.push_back(source);
  }
  std::optional<rng::RngResumeStateProto> rng_state;
  const std::string rng_path = absl::StrCat(dir, "/", kRngFile);
  if (Exists(rng_path)) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(rng_path));
    LOCKSTEP_ASSIGN_OR_RETURN(rng_state, rng::ParseResumeState(bytes));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(std::string counters,
                            ReadWholeFile(absl::StrCat(dir, "/", kTrainerFile)));
  int64_t forward_index = 0;
  if (std::sscanf(counters.c_str(), "forward_index %ld", &forward_index) != 1 ||
      forward_index < 0) {
    return absl::DataLossError(absl::StrCat(where, ": ", kTrainerFile, " is damaged"));
  }
  const std::string optimizer_path = absl::StrCat(dir, "/", kOptimizerFile);
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
      CallTorch("copying the weights",
                [&] {
                  at::AutoGradMode no_grad(false);
                  for (size_t i = 0; i < weights.size(); ++i) {
                    weights[i].second.copy_(sources[i]->to(weights[i].second.device()));
                  }
                }),
      where);
  report.weights = static_cast<int>(weights.size());
  if (optimizer != nullptr && Exists(optimizer_path)) {
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(CallTorch("loading the optimizer",
                                                    [&] {
                                                      torch::serialize::InputArchive archive;
                                                      archive.load_from(optimizer_path);
                                                      optimizer->load(archive);
                                                    }),
                                          where);
    report.optimizer = true;
  }
  if (rng_state.has_value()) {
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
        rng::RestoreResumeState(*rng_state, *collaborators_.streams), where);
    report.rng_streams = true;
  }
  forward_index_ = forward_index;
  return report;
}

}  // namespace trainer
}  // namespace lockstep
