#include "planner/plan_check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/sha256.h"

namespace lockstep {
namespace planner {
namespace {

absl::Status Invalid(int m, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("microbatch ", m, ": ", what));
}

// (token_begin, end, microbatch) of every packed part, per batch sequence.
using PartsBySequence = std::vector<std::vector<std::tuple<int64_t, int64_t, int>>>;

// Scratch for the shard checks, reused across microbatches.
struct ShardScratch {
  std::vector<ShardPiece> pieces, ordered;
  std::vector<int64_t> bucket_start, bucket_fill;
};

// The loss scale the plan's normalisation gives sequence i of `batch`; `total` receives the sum
// of the batch's loss weights, summed as PlanMicrobatches sums them.
std::vector<double> ExpectedScales(const Plan& plan, absl::Span<const Sequence> batch,
                                   double& total) {
  std::vector<double> weight(batch.size());
  total = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Sequence& s = batch[i];
    double w = 0;
    if (s.loss_weights.empty()) {
      w = static_cast<double>(s.num_tokens);
    } else {
      for (float x : s.loss_weights) w += x;
    }
    weight[i] = w;
    total += w;
  }
  std::vector<double> scale(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    switch (plan.limits().loss_normalization()) {
      case LOSS_TOKEN_MEAN:
        scale[i] = 1.0 / total;
        break;
      case LOSS_SUM:
        scale[i] = 1.0;
        break;
      default:
        scale[i] = 1.0 / (weight[i] * static_cast<double>(batch.size()));
        break;
    }
  }
  return scale;
}

}  // namespace

bool KnownPacking(PackingPolicy packing) {
  return packing == PACKING_FIRST_FIT_DECREASING || packing == PACKING_IN_ORDER;
}

bool Close(double value, double want) {
  return std::isfinite(value) && std::abs(value - want) <= 1e-12 * std::abs(want);
}

namespace {

// The plan's limits, packing policies and split count, before anything is read by them.
absl::Status CheckLimits(const Plan& plan) {
  const int64_t budget = plan.limits().max_tokens_per_microbatch();
  const int cp = plan.limits().cp_size();
  if (budget <= 0 || cp <= 0 || cp > kMaxCpSize || budget < 2 * int64_t{cp}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "limits: max_tokens_per_microbatch ", budget, ", cp_size ", cp, " (cp_size in [1, ",
        kMaxCpSize, "], the budget positive and at least 2 x cp_size)"));
  }
  const LossNormalization norm = plan.limits().loss_normalization();
  if (norm != LOSS_TOKEN_MEAN && norm != LOSS_SUM && norm != LOSS_SEQUENCE_MEAN) {
    return absl::InvalidArgumentError(absl::StrCat("limits: loss normalization ", norm));
  }
  if (!KnownPacking(plan.limits().packing()) || !KnownPacking(plan.packing_applied()) ||
      (plan.limits().packing() == PACKING_IN_ORDER && plan.packing_applied() != PACKING_IN_ORDER)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "packing: the limits ask for policy ", plan.limits().packing(), ", the plan applied ",
        plan.packing_applied(), " (policies: ", PACKING_FIRST_FIT_DECREASING,
        " first-fit-decreasing, which may fall back to ", PACKING_IN_ORDER,
        " in order; in order applies in order)"));
  }
  if (plan.splits() < 0 || plan.splits() >= std::max(plan.microbatches_size(), 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the plan says it was split ", plan.splits(), " times; with ",
                     plan.microbatches_size(), " microbatches it can have been split 0 to ",
                     std::max(plan.microbatches_size() - 1, 0), " times"));
  }
  return absl::OkStatus();
}

// The batch is plannable and the plan's totals, CP chunk rule and loss weights digest are the
// batch's.
absl::Status CheckCoversBatch(const Plan& plan, absl::Span<const Sequence> batch) {
  int64_t batch_tokens = 0;
  for (const Sequence& s : batch) {
    if (s.num_tokens <= 0 || s.num_tokens > std::numeric_limits<int64_t>::max() - batch_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("the batch is not plannable: sequence id ", s.id, " has ", s.num_tokens,
                       " tokens after ", batch_tokens, " (each positive, the sum within 64 bits)"));
    }
    batch_tokens += s.num_tokens;
  }
  if (plan.num_sequences() != static_cast<int64_t>(batch.size()) ||
      plan.num_tokens() != batch_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("the plan covers ", plan.num_sequences(), " sequences of ", plan.num_tokens(),
                     " tokens; the batch has ", batch.size(), " of ", batch_tokens));
  }
  if (plan.cp_chunk_rule() != kCpChunkRule) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the plan's CP chunk rule is ", plan.cp_chunk_rule(), "; this library knows only rule ",
        kCpChunkRule, " (CP_CHUNK_MIRRORED_PAIRS_V1)"));
  }
  const Sha256Digest weights_digest = LossWeightsDigest(batch);
  const std::string expected_digest(reinterpret_cast<const char*>(weights_digest.data()),
                                    weights_digest.size());
  if (plan.loss_weights_digest() != expected_digest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the plan's loss weights digest ",
        absl::BytesToHexString(plan.loss_weights_digest()).substr(0, 16),
        " does not match the batch's per-token loss weights (", DigestHex(weights_digest, 8), ")"));
  }
  return absl::OkStatus();
}

// Microbatch m's per-sequence arrays agree in length, its cu_seqlens start at 0, increase
// strictly and end at num_tokens, and it holds at most `budget` tokens.
absl::Status CheckMicrobatchArrays(const Microbatch& mb, int m, int64_t budget) {
  const int n = mb.batch_index_size();
  if (n == 0) return Invalid(m, "it packs no sequence");
  if (mb.sequence_id_size() != n || (mb.token_begin_size() != 0 && mb.token_begin_size() != n) ||
      (mb.loss_scale_size() != 1 && mb.loss_scale_size() != n) || mb.cu_seqlens_size() != n + 1) {
    return Invalid(
        m, absl::StrCat(n, " batch indices but ", mb.sequence_id_size(), " ids, ",
                        mb.token_begin_size(), " token begins, ", mb.loss_scale_size(),
                        " loss scales, ", mb.cu_seqlens_size(), " boundaries (token begins: 0 or ",
                        n, "; loss scales: 1 or ", n, "; boundaries: ", n + 1, ")"));
  }
  if (mb.cu_seqlens(0) != 0) return Invalid(m, "cu_seqlens does not start at 0");
  for (int k = 0; k < n; ++k) {
    if (mb.cu_seqlens(k + 1) <= mb.cu_seqlens(k)) {
      return Invalid(m, absl::StrCat("cu_seqlens is not strictly increasing at ", k + 1));
    }
  }
  if (mb.num_tokens() != mb.cu_seqlens(n)) {
    return Invalid(m, absl::StrCat("num_tokens ", mb.num_tokens(), " but cu_seqlens ends at ",
                                   mb.cu_seqlens(n)));
  }
  if (mb.num_tokens() > budget) {
    return Invalid(m,
                   absl::StrCat("it holds ", mb.num_tokens(), " tokens; the budget is ", budget));
  }
  return absl::OkStatus();
}

// Every packed sequence of microbatch m matches its batch sequence (id, token range) and has
// the loss scale the normalisation gives; its token range is added to `parts`.
absl::Status CheckPackedSequences(const Microbatch& mb, int m, absl::Span<const Sequence> batch,
                                  const std::vector<double>& expected_scale,
                                  PartsBySequence& parts) {
  for (int k = 0; k < mb.batch_index_size(); ++k) {
    const int32_t i = mb.batch_index(k);
    if (i < 0 || static_cast<size_t>(i) >= batch.size()) {
      return Invalid(m, absl::StrCat("packed sequence ", k, " refers to sequence ", i));
    }
    const int64_t begin = TokenBegin(mb, k);
    const int64_t length = mb.cu_seqlens(k + 1) - mb.cu_seqlens(k);
    // Compared without forming begin + length first: an unverified begin may be near 2^63.
    const bool inside = begin >= 0 && length <= batch[i].num_tokens - begin;
    if (mb.sequence_id(k) != batch[i].id || !inside) {
      return Invalid(
          m, absl::StrCat("packed sequence ", k, " (id ", mb.sequence_id(k), ", ", length,
                          " tokens from token ", begin, ") does not match sequence ", i, " (id ",
                          batch[i].id, ", ", batch[i].num_tokens, " tokens)"));
    }
    const int64_t end = begin + length;
    const double want = expected_scale[i];
    if (!Close(LossScale(mb, k), want)) {
      return Invalid(m, absl::StrCat("packed sequence ", k, " has loss scale ", LossScale(mb, k),
                                     "; the normalisation gives ", want));
    }
    parts[i].emplace_back(begin, end, m);
  }
  return absl::OkStatus();
}

// Microbatch m's shard entries against the pieces ShardPieces derives for each rank: ranks in
// order, every piece inside one packed sequence on a chunk the rank owns, stored token and piece
// counts equal to the derived ones. Collects every rank's pieces into `pieces` and the least
// and most tokens a rank owns.
absl::Status CheckShardEntries(const Plan& plan, int m, std::vector<ShardPiece>& pieces,
                               int64_t& min_tokens, int64_t& max_tokens) {
  const Microbatch& mb = plan.microbatches(m);
  const int n = mb.batch_index_size();
  const int cp = plan.limits().cp_size();
  if (mb.shard_cp_rank_size() != cp || mb.shard_num_tokens_size() != cp ||
      mb.shard_num_pieces_size() != cp) {
    return Invalid(m, absl::StrCat(mb.shard_cp_rank_size(), "/", mb.shard_num_tokens_size(), "/",
                                   mb.shard_num_pieces_size(),
                                   " CP shard entries (ranks/tokens/pieces) for cp_size ", cp));
  }
  pieces.clear();
  min_tokens = mb.num_tokens();
  max_tokens = 0;
  for (int r = 0; r < cp; ++r) {
    if (mb.shard_cp_rank(r) != r) {
      return Invalid(m, absl::StrCat("shard entry ", r, " has cp_rank ", mb.shard_cp_rank(r)));
    }
    absl::StatusOr<std::vector<ShardPiece>> mine = ShardPieces(plan, m, r);
    if (!mine.ok()) return Invalid(m, std::string(mine.status().message()));
    int64_t tokens = 0;
    for (size_t p = 0; p < mine->size(); ++p) {
      const ShardPiece& piece = (*mine)[p];
      const int k = piece.sequence;
      if (k < 0 || k >= n || piece.begin >= piece.end || piece.begin < mb.cu_seqlens(k) ||
          piece.end > mb.cu_seqlens(k + 1)) {
        return Invalid(m, absl::StrCat("CP rank ", r, " piece ", p, " [", piece.begin, ", ",
                                       piece.end, ") is empty or outside packed sequence ", k));
      }
      if (piece.chunk != r && piece.chunk != 2 * cp - 1 - r) {
        return Invalid(m, absl::StrCat("CP rank ", r, " owns chunk ", piece.chunk,
                                       "; it may own only ", r, " and ", 2 * cp - 1 - r));
      }
      tokens += piece.end - piece.begin;
      pieces.push_back(piece);
    }
    if (tokens != mb.shard_num_tokens(r)) {
      return Invalid(m, absl::StrCat("CP rank ", r, " says ", mb.shard_num_tokens(r),
                                     " tokens; its pieces hold ", tokens));
    }
    if (static_cast<int64_t>(mine->size()) != mb.shard_num_pieces(r)) {
      return Invalid(m, absl::StrCat("CP rank ", r, " says ", mb.shard_num_pieces(r),
                                     " pieces; the chunk rule gives it ", mine->size()));
    }
    min_tokens = std::min(min_tokens, tokens);
    max_tokens = std::max(max_tokens, tokens);
  }
  return absl::OkStatus();
}

// The CP ranks' pieces of microbatch m (scratch.pieces) tile its packed tokens: every token
// owned exactly once, chunks in order within a packed sequence.
absl::Status CheckShardTiling(const Microbatch& mb, int m, ShardScratch& scratch) {
  const int n = mb.batch_index_size();
  // Order the pieces by offset: bucket them by packed sequence (a counting sort; each rank's
  // pieces are already in sequence order), then sort each sequence's at most 2 x cp pieces.
  std::vector<int64_t>& bucket_start = scratch.bucket_start;
  std::vector<ShardPiece>& ordered = scratch.ordered;
  bucket_start.assign(n + 1, 0);
  for (const ShardPiece& piece : scratch.pieces) ++bucket_start[piece.sequence + 1];
  for (int k = 0; k < n; ++k) bucket_start[k + 1] += bucket_start[k];
  ordered.resize(scratch.pieces.size());
  {
    std::vector<int64_t>& fill = scratch.bucket_fill;
    fill.assign(bucket_start.begin(), bucket_start.end() - 1);
    for (const ShardPiece& piece : scratch.pieces) ordered[fill[piece.sequence]++] = piece;
  }
  int64_t covered = 0;
  for (int k = 0; k < n; ++k) {
    const auto first = ordered.begin() + bucket_start[k];
    const auto last = ordered.begin() + bucket_start[k + 1];
    std::sort(first, last,
              [](const ShardPiece& a, const ShardPiece& b) { return a.begin < b.begin; });
    for (auto it = first; it != last; ++it) {
      if (it->begin != covered) {
        return Invalid(m,
                       absl::StrCat("packed tokens [", std::min(it->begin, covered), ", ",
                                    std::max(it->begin, covered), ") are ",
                                    it->begin > covered ? "owned by no CP rank" : "owned twice"));
      }
      if (it != first && (it - 1)->chunk >= it->chunk) {
        return Invalid(m, absl::StrCat("chunks of packed sequence ", k, " are out of order"));
      }
      covered = it->end;
    }
  }
  if (covered != mb.num_tokens()) {
    return Invalid(m, absl::StrCat("packed tokens [", covered, ", ", mb.num_tokens(),
                                   ") are owned by no CP rank"));
  }
  return absl::OkStatus();
}

// Shards: the stored counts against the pieces ShardPieces derives, the pieces against the
// tiling (every packed token owned exactly once, chunks in order within a sequence), and the
// balance between the ranks.
absl::Status CheckShards(const Plan& plan, int m, ShardScratch& scratch) {
  int64_t min_tokens = 0, max_tokens = 0;
  if (absl::Status s = CheckShardEntries(plan, m, scratch.pieces, min_tokens, max_tokens);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckShardTiling(plan.microbatches(m), m, scratch); !s.ok()) return s;
  if (max_tokens - min_tokens > 2) {
    return Invalid(m, absl::StrCat("CP ranks own between ", min_tokens, " and ", max_tokens,
                                   " tokens; the balance allows a difference of 2"));
  }
  return absl::OkStatus();
}

// Every token of every batch sequence lies in exactly one microbatch (`parts`: each sequence's
// packed token ranges; sorted here).
absl::Status CheckSequenceCoverage(absl::Span<const Sequence> batch, PartsBySequence& parts) {
  for (size_t i = 0; i < batch.size(); ++i) {
    std::sort(parts[i].begin(), parts[i].end());
    int64_t covered = 0;
    for (const auto& [begin, end, m] : parts[i]) {
      if (begin != covered) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sequence ", i, " (id ", batch[i].id, "): tokens [", std::min(begin, covered), ", ",
            std::max(begin, covered), ") are ",
            begin > covered ? "in no microbatch" : "planned twice", " (microbatch ", m, ")"));
      }
      covered = end;
    }
    if (covered != batch[i].num_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", i, " (id ", batch[i].id, "): tokens [", covered, ", ",
                       batch[i].num_tokens, ") are in no microbatch"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status VerifyPlan(const Plan& plan, absl::Span<const Sequence> batch) {
  if (absl::Status s = CheckLimits(plan); !s.ok()) return s;
  if (absl::Status s = CheckCoversBatch(plan, batch); !s.ok()) return s;
  double weight_total = 0;
  const std::vector<double> expected_scale = ExpectedScales(plan, batch, weight_total);
  if (!Close(plan.loss_weight_total(), weight_total)) {
    return absl::InvalidArgumentError(absl::StrCat("the plan's loss weight total ",
                                                   plan.loss_weight_total(), " is not the batch's ",
                                                   weight_total));
  }
  const int64_t budget = plan.limits().max_tokens_per_microbatch();
  ShardScratch scratch;
  PartsBySequence parts(batch.size());
  for (int m = 0; m < plan.microbatches_size(); ++m) {
    const Microbatch& mb = plan.microbatches(m);
    if (absl::Status s = CheckMicrobatchArrays(mb, m, budget); !s.ok()) return s;
    if (absl::Status s = CheckPackedSequences(mb, m, batch, expected_scale, parts); !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckShards(plan, m, scratch); !s.ok()) return s;
  }
  return CheckSequenceCoverage(batch, parts);
}

}  // namespace planner
}  // namespace lockstep
