#include "trainer/internal/output_assembly.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <string>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "c10/core/Event.h"
#include "c10/core/Stream.h"
#include "c10/core/StreamGuard.h"
#include "c10/core/impl/VirtualGuardImpl.h"
#include "torch/csrc/autograd/custom_function.h"
#include "trainer/internal/shard_inputs.h"

namespace lockstep {
namespace trainer {
namespace internal {
namespace {

// Up to this many shard pieces in a microbatch (over all CP ranks), the gathered outputs are
// assembled by one copy per piece; beyond it, by one index_select (a kernel launch per piece
// would cost more than listing every token).
constexpr int64_t kMaxPieceCopies = 64;

// An output tensor already filled (outside autograd); not an input of the graph.
struct Filled {
  at::Tensor full;
};

// The full outputs of a microbatch as a differentiable function of this rank's forward output
// `local`: forward hands back `filled.full` (every rank's rows, already in place), backward gives
// `local` the gradient of its own rows, which lie in `full` as the runs `own_runs` ((first row,
// rows) pairs, in `local`'s order). One node whatever the number of runs, and always in the
// graph, even for an empty shard (a zero-row gradient).
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

}  // namespace

absl::StatusOr<at::Tensor> OutputAssembly::Gather(collectives::Communicator& group,
                                                  const ShardLayout& layout,
                                                  const at::Tensor& local,
                                                  const std::string& where) {
  const int64_t widest = layout.widest;
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
  int64_t piece_count = 0;
  for (const auto& p : layout.pieces) piece_count += static_cast<int64_t>(p.size());
  if (piece_count <= kMaxPieceCopies) return GatherByPieces(group, layout, local, padded, where);
  return GatherByIndex(group, layout, local, padded, where);
}

absl::Status OutputAssembly::ListRuns(const ShardLayout& layout, const std::string& where) {
  std::vector<PieceSource>& sources = piece_sources_;
  sources.clear();
  for (size_t c = 0; c < layout.pieces.size(); ++c) {
    const int member =
        static_cast<int>(c) == layout.cp_rank ? PieceSource::kOwn : (*layout.cp_holders)[c];
    int64_t row = 0;
    for (const planner::ShardPiece& p : layout.pieces[c]) {
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
  if (covered != layout.microbatch->num_tokens()) {
    return absl::InternalError(absl::StrCat(where, ": the CP shards' pieces cover ", covered,
                                            " leading tokens of ", layout.microbatch->num_tokens(),
                                            " without gap or overlap"));
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> OutputAssembly::GatherByPieces(collectives::Communicator& group,
                                                          const ShardLayout& layout,
                                                          const at::Tensor& local,
                                                          const at::Tensor& padded,
                                                          const std::string& where) {
  LOCKSTEP_RETURN_IF_ERROR(ListRuns(layout, where));
  // The own runs go into `full` now, from `local`, while the all-gather runs; the output handed
  // back is made now too (AssembledOutputs puts `local` into the graph), so that after the gather
  // only the others' copies remain to be queued.
  at::Tensor full, output;
  std::optional<c10::Event> own_copied;
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
      CallTorch(
          "placing the own rows",
          [&] {
            std::vector<int64_t> shape = local.sizes().vec();
            shape[0] = layout.microbatch->num_tokens();
            full = at::empty(shape, local.options().requires_grad(false));
            const at::Tensor source = local.detach();
            auto copy_own = [&] {
              for (const PieceSource& run : piece_sources_) {
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
            // Neither block is reused before the side stream is done with it (even if the
            // all-gather fails and both are dropped).
            device.recordDataPtrOnStream(source.storage().data_ptr(), side);
            device.recordDataPtrOnStream(full.storage().data_ptr(), side);
            own_copied.emplace(local.device().type());
            own_copied->record(side);
          }),
      where);
  std::vector<int64_t> own_runs;  // (row of `full`, rows), in `local`'s order
  for (const PieceSource& run : piece_sources_) {
    if (run.member != PieceSource::kOwn) continue;
    own_runs.push_back(run.begin);
    own_runs.push_back(run.count);
  }
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(CallTorch("assembling the full outputs",
                                                  [&] {
                                                    // `full` stays a plain tensor for the copies to
                                                    // come; the output shares it.
                                                    const at::Tensor shared = full;
                                                    full = full.detach();
                                                    output = AssembledOutputs::apply(
                                                        local, Filled{shared}, own_runs);
                                                  }),
                                        where);
  // The others' runs are queued as soon as the all-gather is: on a GPU they follow it on the
  // stream instead of waiting for the host to see it complete.
  auto copy_others = [&](const std::vector<at::Tensor>& gathered) -> absl::Status {
    return CallTorch("assembling the full outputs", [&] {
      if (own_copied.has_value()) own_copied->block(CurrentStreamOf(local));
      for (const PieceSource& run : piece_sources_) {
        if (run.member == PieceSource::kOwn) continue;
        full.narrow(0, run.begin, run.count)
            .copy_(gathered[run.member].narrow(0, run.row, run.count));
      }
    });
  };
  absl::StatusOr<std::vector<at::Tensor>> all = group.AllGatherThen(padded, copy_others);
  if (!all.ok()) return Annotate(all.status(), absl::StrCat(where, ": gathering the outputs"));
  return output;
}

absl::StatusOr<at::Tensor> OutputAssembly::GatherByIndex(collectives::Communicator& group,
                                                         const ShardLayout& layout,
                                                         const at::Tensor& local,
                                                         const at::Tensor& padded,
                                                         const std::string& where) {
  const planner::Microbatch& mb = *layout.microbatch;
  const std::vector<planner::ShardPiece>& mine = layout.pieces[layout.cp_rank];
  const int64_t my_tokens = local.size(0);
  // Every packed token's row in the gathered shards, then this rank's own tokens' places (the
  // shard's packed offsets): they go back in with one index_copy. Built before the all-gather
  // waits, while the forward's kernels may still run.
  std::vector<int64_t>& index = gather_index_;
  index.assign(static_cast<size_t>(mb.num_tokens() + my_tokens), 0);
  for (size_t c = 0; c < layout.pieces.size(); ++c) {
    int64_t row = static_cast<int64_t>((*layout.cp_holders)[c]) * layout.widest;
    for (const planner::ShardPiece& p : layout.pieces[c]) {
      std::iota(index.data() + p.begin, index.data() + p.end, row);
      row += p.end - p.begin;
    }
  }
  int64_t* own = index.data() + mb.num_tokens();
  for (const planner::ShardPiece& p : mine) {
    std::iota(own, own + (p.end - p.begin), p.begin);
    own += p.end - p.begin;
  }
  absl::StatusOr<std::vector<at::Tensor>> all = group.AllGather(padded);
  if (!all.ok()) return Annotate(all.status(), absl::StrCat(where, ": gathering the outputs"));
  const std::vector<at::Tensor>& gathered = *all;
  at::Tensor assembled;
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
            // A copy even on the CPU: autograd keeps the index for backward, and the scratch
            // list is reused by the next microbatch.
            const at::Tensor device_index =
                at::from_blob(index.data(), {static_cast<int64_t>(index.size())}, at::kLong)
                    .to(padded.device(), at::kLong, /*non_blocking=*/false, /*copy=*/true);
            assembled = side_by_side.index_select(0, device_index.narrow(0, 0, mb.num_tokens()));
            assembled.index_copy_(0, device_index.narrow(0, mb.num_tokens(), my_tokens), local);
          }),
      where);
  return assembled;
}

}  // namespace internal
}  // namespace trainer
}  // namespace lockstep
