// planner/plan_readers.cc: the readers of a plan (planner.h): the packed sequences' token
// begins and loss scales, position ids, the CP shards' pieces and token indices, per-token loss
// weights and packing efficiency. Each checks what it reads first, so that an unverified plan
// gets a status, never an out-of-range read.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "planner/internal/cp_chunks.h"
#include "planner/internal/planner_shared.h"
#include "planner/planner.h"

namespace lockstep {
namespace planner {
namespace internal {

absl::Status CheckBoundaries(const Microbatch& mb, absl::string_view what) {
  const int n = mb.cu_seqlens_size() - 1;
  if (n < 0 || mb.cu_seqlens(0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cu_seqlens does not start at 0"));
  }
  const int64_t* cu = mb.cu_seqlens().data();
  for (int k = 0; k < n; ++k) {
    if (cu[k + 1] <= cu[k]) {
      return absl::InvalidArgumentError(absl::StrCat(what,
                                                     ": cu_seqlens is not strictly increasing at ",
                                                     k + 1, " (", cu[k], " then ", cu[k + 1], ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace internal
namespace {

using internal::CheckBoundaries;
using internal::SequenceName;
using internal::ValidCompactSizes;

// The per-sequence arrays of `mb` agree in length, its cu_seqlens are well formed and end at
// num_tokens, and its token_begin entries are non-negative: what the token-listing functions
// need before they trust the microbatch's sizes.
absl::Status CheckMicrobatchShape(const Microbatch& mb) {
  const int n = mb.batch_index_size();
  if (mb.cu_seqlens_size() != n + 1 || mb.sequence_id_size() != n || !ValidCompactSizes(mb, n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the microbatch is malformed: ", n, " batch indices, ", mb.sequence_id_size(),
                     " ids, ", mb.token_begin_size(), " token begins, ", mb.loss_scale_size(),
                     " loss scales, ", mb.cu_seqlens_size(), " boundaries"));
  }
  LOCKSTEP_RETURN_IF_ERROR(CheckBoundaries(mb, "the microbatch is malformed"));
  if (mb.num_tokens() != mb.cu_seqlens(n)) {
    return absl::InvalidArgumentError(absl::StrCat("the microbatch is malformed: num_tokens ",
                                                   mb.num_tokens(), " but cu_seqlens ends at ",
                                                   mb.cu_seqlens(n)));
  }
  for (int k = 0; k < mb.token_begin_size(); ++k) {
    const int64_t begin = mb.token_begin(k);
    const int64_t length = mb.cu_seqlens(k + 1) - mb.cu_seqlens(k);
    if (begin < 0 || begin > std::numeric_limits<int64_t>::max() - length) {
      return absl::InvalidArgumentError(
          absl::StrCat("the microbatch is malformed: packed sequence ", k, " begins at token ",
                       begin, " and holds ", length));
    }
  }
  return absl::OkStatus();
}

// kResourceExhausted when a token list of `tokens` entries would exceed kMaxListedTokens.
absl::Status CheckListable(int64_t tokens, absl::string_view what) {
  if (tokens > kMaxListedTokens) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " would list ", tokens, " tokens; the limit is ", kMaxListedTokens));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t TokenBegin(const Microbatch& microbatch, int k) {
  return microbatch.token_begin_size() == 0 ? 0 : microbatch.token_begin(k);
}

double LossScale(const Microbatch& microbatch, int k) {
  return microbatch.loss_scale(microbatch.loss_scale_size() == 1 ? 0 : k);
}

absl::StatusOr<std::vector<int64_t>> PositionIds(const Microbatch& microbatch) {
  LOCKSTEP_RETURN_IF_ERROR(CheckMicrobatchShape(microbatch));
  LOCKSTEP_RETURN_IF_ERROR(CheckListable(microbatch.num_tokens(), "PositionIds"));
  std::vector<int64_t> positions;
  positions.reserve(microbatch.num_tokens());
  for (int k = 0; k + 1 < microbatch.cu_seqlens_size(); ++k) {
    const int64_t start = TokenBegin(microbatch, k);
    for (int64_t t = microbatch.cu_seqlens(k); t < microbatch.cu_seqlens(k + 1); ++t) {
      positions.push_back(start + t - microbatch.cu_seqlens(k));
    }
  }
  return positions;
}

absl::StatusOr<std::vector<ShardPiece>> ShardPieces(const Plan& plan, int microbatch, int cp_rank) {
  if (plan.cp_chunk_rule() != kCpChunkRule) {
    return absl::FailedPreconditionError(
        absl::StrCat("the plan's CP chunk rule is ", plan.cp_chunk_rule(),
                     "; this library derives shards only under rule ", kCpChunkRule,
                     " (CP_CHUNK_MIRRORED_PAIRS_V1)"));
  }
  const int cp = plan.limits().cp_size();
  if (cp <= 0 || cp > kMaxCpSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("the plan's cp_size is ", cp, "; it must be in [1, ", kMaxCpSize, "]"));
  }
  if (microbatch < 0 || microbatch >= plan.microbatches_size()) {
    return absl::InvalidArgumentError(absl::StrCat("microbatch ", microbatch,
                                                   " is not in the plan, which has ",
                                                   plan.microbatches_size(), " microbatches"));
  }
  if (cp_rank < 0 || cp_rank >= cp) {
    return absl::InvalidArgumentError(
        absl::StrCat("CP rank ", cp_rank, " is not in [0, ", cp, ") (cp_size ", cp, ")"));
  }
  const Microbatch& mb = plan.microbatches(microbatch);
  const int n = mb.cu_seqlens_size() - 1;
  if (absl::Status s = CheckBoundaries(mb, absl::StrCat("microbatch ", microbatch)); !s.ok())
    return s;
  const int64_t* cu = mb.cu_seqlens().data();
  std::vector<ShardPiece> pieces;
  pieces.reserve(2 * static_cast<size_t>(n));
  internal::RankPieces(cu, n, cp, cp_rank, [&](int k, int j, int64_t begin, int64_t end) {
    pieces.push_back({k, j, begin, end});
  });
  return pieces;
}

absl::StatusOr<std::vector<int64_t>> ShardTokenIndices(const Plan& plan, int microbatch,
                                                       int cp_rank) {
  absl::StatusOr<std::vector<ShardPiece>> pieces = ShardPieces(plan, microbatch, cp_rank);
  if (!pieces.ok()) return pieces.status();
  const Microbatch& mb = plan.microbatches(microbatch);
  LOCKSTEP_RETURN_IF_ERROR(
      CheckListable(mb.cu_seqlens(mb.cu_seqlens_size() - 1), "ShardTokenIndices"));
  int64_t tokens = 0;
  for (const ShardPiece& p : *pieces) tokens += p.end - p.begin;
  std::vector<int64_t> indices;
  indices.reserve(tokens);
  for (const ShardPiece& p : *pieces) {
    for (int64_t t = p.begin; t < p.end; ++t) indices.push_back(t);
  }
  return indices;
}

absl::Status WriteTokenLossWeights(const Microbatch& microbatch, absl::Span<const Sequence> batch,
                                   absl::Span<double> out) {
  LOCKSTEP_RETURN_IF_ERROR(CheckMicrobatchShape(microbatch));
  LOCKSTEP_RETURN_IF_ERROR(CheckListable(microbatch.num_tokens(), "TokenLossWeights"));
  if (static_cast<int64_t>(out.size()) != microbatch.num_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat("loss weights: room for ", out.size(),
                                                   " tokens, the microbatch has ",
                                                   microbatch.num_tokens()));
  }
  const int n = microbatch.batch_index_size();
  // Every packed sequence against the batch first, so that nothing is written for a mismatch.
  for (int k = 0; k < n; ++k) {
    const int32_t i = microbatch.batch_index(k);
    if (i < 0 || static_cast<size_t>(i) >= batch.size()) {
      return absl::InvalidArgumentError(absl::StrCat("packed sequence ", k, " refers to sequence ",
                                                     i, "; the batch has ", batch.size()));
    }
    const Sequence& s = batch[i];
    const int64_t begin = TokenBegin(microbatch, k);
    const int64_t count = microbatch.cu_seqlens(k + 1) - microbatch.cu_seqlens(k);
    if (s.id != microbatch.sequence_id(k) || count > s.num_tokens - begin) {
      return absl::InvalidArgumentError(
          absl::StrCat("packed sequence ", k, " (", count, " tokens from ", begin, " of id ",
                       microbatch.sequence_id(k), ") does not match ", SequenceName(batch, i),
                       " with ", s.num_tokens, " tokens"));
    }
    if (!s.loss_weights.empty() && static_cast<int64_t>(s.loss_weights.size()) != s.num_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(SequenceName(batch, i), " has ",
                                                     s.loss_weights.size(), " loss weights for ",
                                                     s.num_tokens, " tokens"));
    }
  }
  double* next = out.data();
  for (int k = 0; k < n; ++k) {
    const Sequence& s = batch[microbatch.batch_index(k)];
    const int64_t begin = TokenBegin(microbatch, k);
    const int64_t count = microbatch.cu_seqlens(k + 1) - microbatch.cu_seqlens(k);
    const double scale = LossScale(microbatch, k);
    if (s.loss_weights.empty()) {
      next = std::fill_n(next, count, scale);
    } else {
      next = std::transform(s.loss_weights.begin() + begin, s.loss_weights.begin() + begin + count,
                            next, [scale](double w) { return w * scale; });
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> TokenLossWeights(const Microbatch& microbatch,
                                                     absl::Span<const Sequence> batch) {
  LOCKSTEP_RETURN_IF_ERROR(CheckMicrobatchShape(microbatch));
  LOCKSTEP_RETURN_IF_ERROR(CheckListable(microbatch.num_tokens(), "TokenLossWeights"));
  std::vector<double> weights(static_cast<size_t>(microbatch.num_tokens()));
  LOCKSTEP_RETURN_IF_ERROR(WriteTokenLossWeights(microbatch, batch, absl::MakeSpan(weights)));
  return weights;
}

double PackingEfficiency(const Plan& plan) {
  const double capacity = static_cast<double>(plan.microbatches_size()) *
                          static_cast<double>(plan.limits().max_tokens_per_microbatch());
  return capacity > 0 ? static_cast<double>(plan.num_tokens()) / capacity : 0.0;
}

}  // namespace planner
}  // namespace lockstep
