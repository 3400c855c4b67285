#include "planner/plan_check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace planner {
namespace {

absl::Status Invalid(int m, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("microbatch ", m, ": ", what));
}

// The loss scale the plan's normalisation gives sequence i of `batch`.
std::vector<double> ExpectedScales(const Plan& plan, absl::Span<const Sequence> batch) {
  std::vector<double> weight(batch.size());
  double total = 0;
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

absl::Status VerifyPlan(const Plan& plan, absl::Span<const Sequence> batch) {
  const int64_t budget = plan.limits().max_tokens_per_microbatch();
  const int cp = plan.limits().cp_size();
  if (budget <= 0 || cp <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("limits: max_tokens_per_microbatch ", budget, ", cp_size ", cp));
  }
  const LossNormalization norm = plan.limits().loss_normalization();
  if (norm != LOSS_TOKEN_MEAN && norm != LOSS_SUM && norm != LOSS_SEQUENCE_MEAN) {
    return absl::InvalidArgumentError(absl::StrCat("limits: loss normalization ", norm));
  }
  int64_t batch_tokens = 0;
  for (const Sequence& s : batch) batch_tokens += s.num_tokens;
  if (plan.num_sequences() != static_cast<int64_t>(batch.size()) ||
      plan.num_tokens() != batch_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("the plan covers ", plan.num_sequences(), " sequences of ", plan.num_tokens(),
                     " tokens; the batch has ", batch.size(), " of ", batch_tokens));
  }
  const std::vector<double> expected_scale = ExpectedScales(plan, batch);
  // (token_begin, end, microbatch) of every packed part, per batch sequence.
  std::vector<std::vector<std::tuple<int64_t, int64_t, int>>> parts(batch.size());
  for (int m = 0; m < plan.microbatches_size(); ++m) {
    const Microbatch& mb = plan.microbatches(m);
    const int n = mb.batch_index_size();
    if (n == 0) return Invalid(m, "it packs no sequence");
    if (mb.sequence_id_size() != n || mb.token_begin_size() != n || mb.loss_scale_size() != n ||
        mb.cu_seqlens_size() != n + 1) {
      return Invalid(m, absl::StrCat(n, " batch indices but ", mb.sequence_id_size(), " ids, ",
                                     mb.token_begin_size(), " token begins, ", mb.loss_scale_size(),
                                     " loss scales, ", mb.cu_seqlens_size(), " boundaries"));
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
    for (int k = 0; k < n; ++k) {
      const int32_t i = mb.batch_index(k);
      if (i < 0 || static_cast<size_t>(i) >= batch.size()) {
        return Invalid(m, absl::StrCat("packed sequence ", k, " refers to sequence ", i));
      }
      const int64_t begin = mb.token_begin(k);
      const int64_t end = begin + mb.cu_seqlens(k + 1) - mb.cu_seqlens(k);
      if (mb.sequence_id(k) != batch[i].id || begin < 0 || end > batch[i].num_tokens) {
        return Invalid(
            m, absl::StrCat("packed sequence ", k, " (id ", mb.sequence_id(k), ", tokens [", begin,
                            ", ", end, ")) does not match sequence ", i, " (id ", batch[i].id, ", ",
                            batch[i].num_tokens, " tokens)"));
      }
      const double want = expected_scale[i];
      if (!(std::abs(mb.loss_scale(k) - want) <= 1e-12 * std::abs(want))) {
        return Invalid(m, absl::StrCat("packed sequence ", k, " has loss scale ", mb.loss_scale(k),
                                       "; the normalisation gives ", want));
      }
      parts[i].emplace_back(begin, end, m);
    }
    // Shards: (begin, end, packed sequence, chunk) of every piece, to check the tiling.
    if (mb.shards_size() != cp) {
      return Invalid(m, absl::StrCat(mb.shards_size(), " CP shards for cp_size ", cp));
    }
    std::vector<std::tuple<int64_t, int64_t, int, int>> pieces;
    int64_t min_tokens = mb.num_tokens(), max_tokens = 0;
    for (int r = 0; r < cp; ++r) {
      const CpShard& shard = mb.shards(r);
      const int np = shard.piece_begin_size();
      if (shard.cp_rank() != r || shard.piece_sequence_size() != np ||
          shard.piece_chunk_size() != np || shard.piece_end_size() != np) {
        return Invalid(m, absl::StrCat("shard ", r, " has cp_rank ", shard.cp_rank(), " and ",
                                       shard.piece_sequence_size(), "/", shard.piece_chunk_size(),
                                       "/", np, "/", shard.piece_end_size(), " piece entries"));
      }
      int64_t tokens = 0;
      for (int p = 0; p < np; ++p) {
        const int k = shard.piece_sequence(p);
        const int chunk = shard.piece_chunk(p);
        const int64_t b = shard.piece_begin(p), e = shard.piece_end(p);
        if (k < 0 || k >= n || b >= e || b < mb.cu_seqlens(k) || e > mb.cu_seqlens(k + 1)) {
          return Invalid(m, absl::StrCat("CP rank ", r, " piece ", p, " [", b, ", ", e,
                                         ") is empty or outside packed sequence ", k));
        }
        if (chunk != r && chunk != 2 * cp - 1 - r) {
          return Invalid(m, absl::StrCat("CP rank ", r, " owns chunk ", chunk, "; it may own only ",
                                         r, " and ", 2 * cp - 1 - r));
        }
        tokens += e - b;
        pieces.emplace_back(b, e, k, chunk);
      }
      if (tokens != shard.num_tokens()) {
        return Invalid(m, absl::StrCat("CP rank ", r, " says ", shard.num_tokens(),
                                       " tokens; its pieces hold ", tokens));
      }
      min_tokens = std::min(min_tokens, tokens);
      max_tokens = std::max(max_tokens, tokens);
    }
    std::sort(pieces.begin(), pieces.end());
    int64_t covered = 0;
    for (size_t p = 0; p < pieces.size(); ++p) {
      const auto& [b, e, k, chunk] = pieces[p];
      if (b != covered) {
        return Invalid(
            m, absl::StrCat("packed tokens [", std::min(b, covered), ", ", std::max(b, covered),
                            ") are ", b > covered ? "owned by no CP rank" : "owned twice"));
      }
      if (p > 0 && std::get<2>(pieces[p - 1]) == k && std::get<3>(pieces[p - 1]) >= chunk) {
        return Invalid(m, absl::StrCat("chunks of packed sequence ", k, " are out of order"));
      }
      covered = e;
    }
    if (covered != mb.num_tokens()) {
      return Invalid(m, absl::StrCat("packed tokens [", covered, ", ", mb.num_tokens(),
                                     ") are owned by no CP rank"));
    }
    if (max_tokens - min_tokens > 2) {
      return Invalid(m, absl::StrCat("CP ranks own between ", min_tokens, " and ", max_tokens,
                                     " tokens; the balance allows a difference of 2"));
    }
  }
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

}  // namespace planner
}  // namespace lockstep
