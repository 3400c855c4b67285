#include "planner/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "planner/internal/cp_chunks.h"
#include "planner/internal/key_set.h"
#include "planner/internal/planner_shared.h"

namespace lockstep {
namespace planner {
namespace {

using internal::CheckBoundaries;
using internal::SequenceName;
using internal::ValidCompactSizes;

// Above this many distinct length values the buckets are indexed by rank among the distinct
// lengths (a sort) instead of by length (a counting sort), to bound memory.
constexpr int64_t kMaxDirectLength = int64_t{1} << 22;

absl::Status ValidateOptions(const PlanOptions& options) {
  const int64_t budget = options.max_tokens_per_microbatch;
  if (budget <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens_per_microbatch is ", budget, "; it must be positive"));
  }
  if (options.cp_size <= 0 || options.cp_size > kMaxCpSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("cp_size is ", options.cp_size, "; it must be in [1, ", kMaxCpSize, "]"));
  }
  if (budget < 2 * static_cast<int64_t>(options.cp_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_tokens_per_microbatch ", budget, " cannot serve cp_size ", options.cp_size,
        ": a microbatch must hold at least 2 x cp_size = ", 2 * int64_t{options.cp_size},
        " tokens so that every CP rank can own its two chunks"));
  }
  if (options.packing != PACKING_FIRST_FIT_DECREASING && options.packing != PACKING_IN_ORDER) {
    return absl::InvalidArgumentError(
        absl::StrCat("packing policy ", options.packing, " is not a packing policy"));
  }
  if (options.loss_normalization != LOSS_TOKEN_MEAN && options.loss_normalization != LOSS_SUM &&
      options.loss_normalization != LOSS_SEQUENCE_MEAN) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss normalization ", options.loss_normalization, " is not a loss normalization"));
  }
  return absl::OkStatus();
}

// What one pass over the batch finds besides its validity.
struct BatchSummary {
  int64_t total_tokens = 0;
  double weight_total = 0;
  int64_t max_length = 0;
  // Microbatches that filling in input order needs (see PackInOrder).
  int64_t in_order_bins = 0;
  // The first sequence with per-token loss weights, or -1 (LossWeightsDigest's work).
  int64_t first_weighted = -1;
};

// Whether first-fit-decreasing can count sequences by length during validation (Note [FFD by
// length buckets]): a histogram indexed by length up to the budget, when the budget is short
// compared with the batch (its lengths then are too: none exceeds the budget).
bool CountsLengthsWhileValidating(size_t batch_size, const PlanOptions& options);

// Checks every sequence and computes the loss scales (see LossNormalization): one per sequence
// for LOSS_SEQUENCE_MEAN, else a single one shared by every sequence.
// With CountsLengthsWhileValidating, also counts the sequences of each length into
// length_counts[length] (budget + 1 entries), sparing first-fit-decreasing a pass over the batch.
absl::Status ValidateBatchAndScale(absl::Span<const Sequence> batch, const PlanOptions& options,
                                   std::vector<double>& scale, BatchSummary& summary,
                                   std::vector<int32_t>& length_counts) {
  if (batch.empty()) {
    return absl::InvalidArgumentError("the batch has no sequences; a plan needs at least one");
  }
  if (batch.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("the batch has ", batch.size(),
                                                   " sequences; a plan holds at most ",
                                                   std::numeric_limits<int32_t>::max()));
  }
  const int64_t budget = options.max_tokens_per_microbatch;
  const bool per_sequence = options.loss_normalization == LOSS_SEQUENCE_MEAN;
  // Per sequence: its weight sum first, turned into its scale at the end.
  if (per_sequence) scale.resize(batch.size());
  int64_t total_tokens = 0, max_length = 0, in_order_bins = 0, fill = budget, first_weighted = -1;
  double weight_total = 0;
  const bool count = CountsLengthsWhileValidating(batch.size(), options);
  length_counts.assign(count ? static_cast<size_t>(budget) + 1 : 0, 0);
  for (size_t i = 0; i < batch.size(); ++i) {
    const Sequence& s = batch[i];
    if (s.num_tokens <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(SequenceName(batch, i), " has ", s.num_tokens,
                                                     " tokens; every sequence needs at least 1"));
    }
    if (s.num_tokens > budget) {
      return absl::InvalidArgumentError(absl::StrCat(SequenceName(batch, i), " has ", s.num_tokens,
                                                     " tokens; a microbatch holds at most ", budget,
                                                     " (max_tokens_per_microbatch)"));
    }
    if (s.num_tokens > std::numeric_limits<int64_t>::max() - total_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("the batch holds more than ",
                                                     std::numeric_limits<int64_t>::max(),
                                                     " tokens at ", SequenceName(batch, i)));
    }
    total_tokens += s.num_tokens;
    max_length = std::max(max_length, s.num_tokens);
    if (count) ++length_counts[s.num_tokens];
    if (s.num_tokens > budget - fill) {  // not fill + n > budget: that can overflow
      ++in_order_bins;
      fill = 0;
    }
    fill += s.num_tokens;
    double w = 0;
    if (s.loss_weights.empty()) {
      w = static_cast<double>(s.num_tokens);
    } else {
      if (first_weighted < 0) first_weighted = static_cast<int64_t>(i);
      if (static_cast<int64_t>(s.loss_weights.size()) != s.num_tokens) {
        return absl::InvalidArgumentError(absl::StrCat(SequenceName(batch, i), " has ",
                                                       s.loss_weights.size(), " loss weights for ",
                                                       s.num_tokens, " tokens"));
      }
      for (size_t t = 0; t < s.loss_weights.size(); ++t) {
        const float x = s.loss_weights[t];
        if (!(std::isfinite(x) && x >= 0)) {
          return absl::InvalidArgumentError(
              absl::StrCat(SequenceName(batch, i), ": loss weight of token ", t, " is ", x,
                           "; loss weights must be finite and non-negative"));
        }
        w += x;
      }
    }
    if (per_sequence) {
      if (w == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(SequenceName(batch, i),
                         ": its loss weights sum to 0; per-sequence-mean normalisation divides "
                         "by each sequence's sum"));
      }
      scale[i] = w;
    }
    weight_total += w;
  }
  summary = {total_tokens, weight_total, max_length, in_order_bins, first_weighted};
  switch (options.loss_normalization) {
    case LOSS_TOKEN_MEAN:
      if (weight_total == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("the batch's loss weights sum to 0 (", batch.size(), " sequences, ",
                         total_tokens, " tokens); token-mean normalisation divides by that sum"));
      }
      scale.assign(1, 1.0 / weight_total);
      break;
    case LOSS_SUM:
      scale.assign(1, 1.0);
      break;
    default:  // LOSS_SEQUENCE_MEAN
      for (size_t i = 0; i < batch.size(); ++i) {
        scale[i] = 1.0 / (scale[i] * static_cast<double>(batch.size()));
      }
      break;
  }
  return absl::OkStatus();
}

// One packed sequence (or part of one) of a microbatch under construction.
struct Part {
  int32_t batch_index;
  int64_t id;
  int64_t token_begin;
  int64_t num_tokens;
  double loss_scale;
};

// Loss scale of sequence i: one shared value, or one per sequence.
inline double ScaleOf(const std::vector<double>& scale, int32_t i) {
  return scale[scale.size() == 1 ? 0 : i];
}

// Fills microbatches in input order, closing one when the next sequence does not fit, and
// passes each one's parts to emit(const std::vector<Part>&). `parts` is scratch.
template <typename Emit>
void PackInOrder(absl::Span<const Sequence> batch, int64_t budget, const std::vector<double>& scale,
                 std::vector<Part>& parts, const Emit& emit) {
  parts.clear();
  int64_t fill = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].num_tokens > budget - fill) {
      emit(parts);
      parts.clear();
      fill = 0;
    }
    fill += batch[i].num_tokens;
    const int32_t index = static_cast<int32_t>(i);
    parts.push_back({index, batch[i].id, 0, batch[i].num_tokens, ScaleOf(scale, index)});
  }
  emit(parts);
}

// Note [FFD by length buckets]
// First-fit-decreasing (items longest first, ties in input order, each into the first bin with
// room) fills bin 1 with exactly the items that a greedy pass "take the longest remaining item
// that still fits" picks: FFD visits items in decreasing order and puts one into bin 1 iff it
// fits what bin 1 has left, and what is left only shrinks. Bin 2 is then the same pass over the
// rest, and so on. So FFD never has to scan bins: bucket the items by length (a counting sort,
// stable, so each bucket is a queue in input order), keep the set of non-empty lengths in a
// KeySet, and fill one bin at a time by asking for the largest non-empty length <= the bin's
// room. That is one query per item plus one per bin. Keys are the lengths themselves when the
// longest sequence is short compared with the batch (at most 8n + 4096 tokens): O(n + bins +
// max length). Otherwise keys are ranks among the distinct lengths: O(n log n + bins).
// An entry of the FFD length queues: the batch index with the id, so that filling the bins does
// not have to reach back into the batch.
struct Queued {
  int64_t id;
  int32_t index;
};

// Keys are lengths themselves (a counting sort) when the longest is short compared with the batch.
bool DirectKeys(int64_t max_length, size_t n) {
  return max_length <= kMaxDirectLength && max_length <= 8 * static_cast<int64_t>(n) + 4096;
}

bool CountsLengthsWhileValidating(size_t batch_size, const PlanOptions& options) {
  return options.packing == PACKING_FIRST_FIT_DECREASING &&
         DirectKeys(options.max_tokens_per_microbatch, batch_size);
}

// Fills first-fit-decreasing microbatches one at a time (see the Note) and passes each one's
// parts to emit(const std::vector<Part>&). Returns false, having emitted max_bins microbatches,
// if it would need more than max_bins. `parts` is scratch. `length_counts` is what
// ValidateBatchAndScale counted (or empty); it is consumed. Bucket positions are 32-bit (the batch
// holds at most INT32_MAX sequences), which halves the tables the fill reads at random.
template <typename Emit>
bool PackFirstFitDecreasing(absl::Span<const Sequence> batch, int64_t budget, int64_t max_length,
                            int64_t max_bins, const std::vector<double>& scale,
                            std::vector<int32_t> length_counts, std::vector<Part>& parts,
                            const Emit& emit) {
  const size_t n = batch.size();
  // Keys: the length itself, or its rank among the distinct lengths when lengths are huge.
  const bool direct = DirectKeys(max_length, n);
  std::vector<int64_t> distinct;
  if (!direct) {
    distinct.reserve(n);
    for (const Sequence& s : batch) distinct.push_back(s.num_tokens);
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  }
  auto key_of = [&](int64_t length) -> int64_t {
    if (direct) return length;
    return std::lower_bound(distinct.begin(), distinct.end(), length) - distinct.begin();
  };
  auto length_of = [&](int64_t key) -> int64_t { return direct ? key : distinct[key]; };
  // The largest key whose length is <= room (may be a key with an empty bucket).
  auto key_for_room = [&](int64_t room) -> int64_t {
    if (direct) return std::min(room, max_length);
    return (std::upper_bound(distinct.begin(), distinct.end(), room) - distinct.begin()) - 1;
  };
  const int64_t keys = direct ? max_length + 1 : static_cast<int64_t>(distinct.size());

  // Counting sort by key, longest first, stable.
  std::vector<int32_t> head;
  std::vector<int64_t> item_key(direct ? 0 : n);
  if (direct && !length_counts.empty()) {
    head = std::move(length_counts);  // counted while validating
    head.resize(static_cast<size_t>(keys) + 1);
  } else {
    head.assign(static_cast<size_t>(keys) + 1, 0);
    for (size_t i = 0; i < n; ++i) {
      const int64_t k = key_of(batch[i].num_tokens);
      if (!direct) item_key[i] = k;
      ++head[k];
    }
  }
  internal::KeySet nonempty(keys);
  int32_t next = 0;
  for (int64_t k = keys - 1; k >= 0; --k) {
    const int32_t count = head[k];
    head[k] = next;
    next += count;
    if (count > 0) nonempty.Insert(k);
  }
  // Buckets lie longest first, so bucket k ends where bucket k - 1 (the next shorter) starts.
  std::vector<int32_t> bucket_end(keys);
  for (int64_t k = 0; k < keys; ++k) bucket_end[k] = k == 0 ? static_cast<int32_t>(n) : head[k - 1];
  std::vector<Queued> order(n);
  {
    std::vector<int32_t> fill = head;
    for (size_t i = 0; i < n; ++i) {
      const int64_t k = direct ? batch[i].num_tokens : item_key[i];
      order[fill[k]++] = {batch[i].id, static_cast<int32_t>(i)};
    }
  }

  size_t placed = 0;
  for (int64_t bins = 0; placed < n; ++bins) {
    if (bins == max_bins) return false;
    parts.clear();
    int64_t room = budget;
    while (room > 0) {
      const int64_t k = nonempty.FindPrev(key_for_room(room));
      if (k < 0) break;
      const Queued item = order[head[k]++];
      if (head[k] == bucket_end[k]) nonempty.Erase(k);
      const int64_t length = length_of(k);
      parts.push_back({item.index, item.id, 0, length, ScaleOf(scale, item.index)});
      room -= length;
      ++placed;
    }
    emit(parts);
  }
  return true;
}

// Fills `mb` with the `n` parts part_at(0 .. n-1) packed in order, and its `cp` shards' counts.
// `scratch` is reused across calls (cp entries).
template <typename PartAt>
void BuildMicrobatch(int n, const PartAt& part_at, int cp, std::vector<int64_t>& scratch,
                     Microbatch& mb) {
  auto& batch_index = *mb.mutable_batch_index();
  auto& sequence_id = *mb.mutable_sequence_id();
  auto& cu_seqlens = *mb.mutable_cu_seqlens();
  batch_index.Resize(n, 0);
  sequence_id.Resize(n, 0);
  cu_seqlens.Resize(n + 1, 0);
  int32_t* bi = batch_index.mutable_data();
  int64_t* id = sequence_id.mutable_data();
  int64_t* cu = cu_seqlens.mutable_data();
  internal::ShardCounts counts(cp, scratch);  // Note [Shard counts without pieces]
  int64_t offset = 0;
  bool all_begin_at_0 = true, one_scale = true;
  const double scale0 = n > 0 ? part_at(0).loss_scale : 0.0;
  cu[0] = 0;
  for (int k = 0; k < n; ++k) {
    const Part part = part_at(k);
    bi[k] = part.batch_index;
    id[k] = part.id;
    all_begin_at_0 = all_begin_at_0 && part.token_begin == 0;
    one_scale = one_scale && part.loss_scale == scale0;
    offset += part.num_tokens;
    cu[k + 1] = offset;
    counts.AddSequence(part.num_tokens);
  }
  // The compact forms of plan.proto: no token_begin when all are 0, one shared loss scale.
  auto& token_begin = *mb.mutable_token_begin();
  token_begin.Clear();
  if (!all_begin_at_0) {
    token_begin.Resize(n, 0);
    for (int k = 0; k < n; ++k) token_begin.Set(k, part_at(k).token_begin);
  }
  auto& loss_scale = *mb.mutable_loss_scale();
  loss_scale.Resize(one_scale ? 1 : n, 0.0);
  for (int k = 0; k < loss_scale.size(); ++k) loss_scale.Set(k, part_at(k).loss_scale);
  mb.set_num_tokens(offset);
  auto& cp_rank = *mb.mutable_shard_cp_rank();
  auto& shard_tokens = *mb.mutable_shard_num_tokens();
  auto& shard_pieces = *mb.mutable_shard_num_pieces();
  cp_rank.Resize(cp, 0);
  shard_tokens.Resize(cp, 0);
  shard_pieces.Resize(cp, 0);
  for (int r = 0; r < cp; ++r) {
    cp_rank.Set(r, r);
    shard_tokens.Set(r, counts.tokens(r));
    shard_pieces.Set(r, counts.pieces(r));
  }
}

}  // namespace

absl::StatusOr<Plan> PlanMicrobatches(absl::Span<const Sequence> batch,
                                      const PlanOptions& options) {
  Plan plan;
  if (absl::Status s = PlanMicrobatches(batch, options, plan); !s.ok()) return s;
  return plan;
}

absl::Status PlanMicrobatches(absl::Span<const Sequence> batch, const PlanOptions& options,
                              Plan& plan) {
  // Clear keeps the microbatch messages and their arrays' capacity for reuse.
  plan.Clear();
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  std::vector<double> scale;
  BatchSummary summary;
  std::vector<int32_t> length_counts;
  if (absl::Status s = ValidateBatchAndScale(batch, options, scale, summary, length_counts);
      !s.ok())
    return s;
  const int64_t budget = options.max_tokens_per_microbatch;
  PlanLimits& limits = *plan.mutable_limits();
  limits.set_max_tokens_per_microbatch(budget);
  limits.set_cp_size(options.cp_size);
  limits.set_packing(options.packing);
  limits.set_loss_normalization(options.loss_normalization);
  plan.set_num_sequences(static_cast<int32_t>(batch.size()));
  plan.set_num_tokens(summary.total_tokens);
  plan.set_loss_weight_total(summary.weight_total);
  plan.set_cp_chunk_rule(kCpChunkRule);
  const Sha256Digest weights_digest =
      internal::LossWeightsDigestFrom(batch, summary.first_weighted);
  plan.set_loss_weights_digest(weights_digest.data(), weights_digest.size());

  // Either policy needs at most as many microbatches as in-order filling (the default falls
  // back to it otherwise), so one reservation holds them all.
  auto& microbatches = *plan.mutable_microbatches();
  microbatches.Reserve(static_cast<int>(summary.in_order_bins));
  std::vector<int64_t> scratch;
  std::vector<Part> parts;
  auto emit = [&](const std::vector<Part>& bin) {
    BuildMicrobatch(
        static_cast<int>(bin.size()), [&](int k) { return bin[k]; }, options.cp_size, scratch,
        *microbatches.Add());
  };
  PackingPolicy applied = options.packing;
  if (options.packing == PACKING_FIRST_FIT_DECREASING &&
      !PackFirstFitDecreasing(batch, budget, summary.max_length, summary.in_order_bins, scale,
                              std::move(length_counts), parts, emit)) {
    // First-fit-decreasing needs more microbatches than in-order filling.
    microbatches.Clear();
    applied = PACKING_IN_ORDER;
  }
  if (applied == PACKING_IN_ORDER) PackInOrder(batch, budget, scale, parts, emit);
  plan.set_packing_applied(applied);
  return absl::OkStatus();
}

namespace {

// The checks of SplitMicrobatch before it reads microbatch `microbatch` of `plan`: the index and
// the CP size in range, a split count that can grow by one, and per-sequence arrays, boundaries
// and token begins consistent enough to cut.
absl::Status CheckSplittable(const Plan& plan, int microbatch) {
  if (microbatch < 0 || microbatch >= plan.microbatches_size()) {
    return absl::InvalidArgumentError(absl::StrCat("microbatch ", microbatch,
                                                   " is not in the plan, which has ",
                                                   plan.microbatches_size(), " microbatches"));
  }
  const int cp = plan.limits().cp_size();
  if (cp <= 0 || cp > kMaxCpSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("the plan's cp_size is ", cp, "; it must be in [1, ", kMaxCpSize, "]"));
  }
  // Splitting adds one microbatch and one split, so splits stays in [0, microbatches - 1]
  // (VerifyPlan's rule); a plan outside it would overflow the count.
  if (plan.splits() < 0 || plan.splits() >= plan.microbatches_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the plan says it was split ", plan.splits(), " times; with ", plan.microbatches_size(),
        " microbatches it must be in [0, ", plan.microbatches_size() - 1, "]"));
  }
  const Microbatch& mb = plan.microbatches(microbatch);
  const int n = mb.batch_index_size();
  if (n == 0 || mb.cu_seqlens_size() != n + 1 || mb.sequence_id_size() != n ||
      !ValidCompactSizes(mb, n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("microbatch ", microbatch, " is malformed: ", n, " batch indices, ",
                     mb.sequence_id_size(), " ids, ", mb.token_begin_size(), " token begins, ",
                     mb.loss_scale_size(), " loss scales, ", mb.cu_seqlens_size(), " boundaries"));
  }
  if (absl::Status s = CheckBoundaries(mb, absl::StrCat("microbatch ", microbatch)); !s.ok())
    return s;
  for (int k = 0; k < n; ++k) {
    // The second half begins up to a part's length later, which must stay representable.
    const int64_t length = mb.cu_seqlens(k + 1) - mb.cu_seqlens(k);
    if (TokenBegin(mb, k) < 0 || TokenBegin(mb, k) > std::numeric_limits<int64_t>::max() - length) {
      return absl::InvalidArgumentError(
          absl::StrCat("microbatch ", microbatch, " is malformed: token_begin of sequence ", k,
                       " is ", TokenBegin(mb, k), " and it holds ", length, " tokens"));
    }
  }
  return absl::OkStatus();
}

// Packed sequence k of `mb` as a part.
Part PartOf(const Microbatch& mb, int k) {
  return Part{mb.batch_index(k), mb.sequence_id(k), TokenBegin(mb, k),
              mb.cu_seqlens(k + 1) - mb.cu_seqlens(k), LossScale(mb, k)};
}

// The sequence boundary of `mb` (two or more packed sequences) closest to half its tokens; the
// earlier one on a tie.
int BoundaryNearestHalf(const Microbatch& mb) {
  const int n = mb.batch_index_size();
  const int64_t total = mb.cu_seqlens(n);
  int cut = 1;
  for (int k = 2; k < n; ++k) {
    // |cu - (total - cu)|: both terms lie in [0, total], so nothing overflows.
    auto off_half = [&](int i) {
      return std::llabs(mb.cu_seqlens(i) - (total - mb.cu_seqlens(i)));
    };
    if (off_half(k) < off_half(cut)) {
      cut = k;
    }
  }
  return cut;
}

// Cuts microbatch `microbatch` (`mb`, checked by CheckSplittable) of a plan over `cp` CP ranks
// into the parts of its two halves, as SplitMicrobatch documents; kFailedPrecondition for a
// single sequence too short to cut.
absl::Status CutMicrobatch(const Microbatch& mb, int microbatch, int cp, std::vector<Part>& first,
                           std::vector<Part>& second) {
  const int n = mb.batch_index_size();
  if (n >= 2) {
    const int cut = BoundaryNearestHalf(mb);
    for (int k = 0; k < n; ++k) (k < cut ? first : second).push_back(PartOf(mb, k));
    return absl::OkStatus();
  }
  const Part whole = PartOf(mb, 0);
  const int64_t step = 2 * int64_t{cp};
  if (whole.num_tokens <= step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "microbatch ", microbatch, " holds only ", whole.num_tokens, " tokens of sequence ",
        whole.batch_index, " (id ", whole.id, "); with cp_size ", cp,
        " a part must keep at least 2 x cp_size = ", step, " tokens, so it cannot be split"));
  }
  const int64_t cut = std::max(step, whole.num_tokens / 2 / step * step);
  first.push_back(whole);
  first.back().num_tokens = cut;
  second.push_back(whole);
  second.back().token_begin += cut;
  second.back().num_tokens -= cut;
  return absl::OkStatus();
}

// `plan` with microbatch `microbatch` replaced by one microbatch of the parts `first` and one of
// `second`, and one more split.
Plan ReplaceBySplit(const Plan& plan, int microbatch, const std::vector<Part>& first,
                    const std::vector<Part>& second) {
  const int cp = plan.limits().cp_size();
  Plan out;
  *out.mutable_limits() = plan.limits();
  out.set_packing_applied(plan.packing_applied());
  out.set_num_sequences(plan.num_sequences());
  out.set_num_tokens(plan.num_tokens());
  out.set_loss_weight_total(plan.loss_weight_total());
  out.set_splits(plan.splits() + 1);
  out.set_cp_chunk_rule(plan.cp_chunk_rule());
  out.set_loss_weights_digest(plan.loss_weights_digest());
  out.mutable_microbatches()->Reserve(plan.microbatches_size() + 1);
  std::vector<int64_t> scratch;
  for (int m = 0; m < plan.microbatches_size(); ++m) {
    if (m == microbatch) {
      for (const std::vector<Part>* half : {&first, &second}) {
        BuildMicrobatch(
            static_cast<int>(half->size()), [&](int k) { return (*half)[k]; }, cp, scratch,
            *out.add_microbatches());
      }
    } else {
      *out.add_microbatches() = plan.microbatches(m);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<Plan> SplitMicrobatch(const Plan& plan, int microbatch) {
  LOCKSTEP_RETURN_IF_ERROR(CheckSplittable(plan, microbatch));
  std::vector<Part> first, second;
  LOCKSTEP_RETURN_IF_ERROR(CutMicrobatch(plan.microbatches(microbatch), microbatch,
                                         plan.limits().cp_size(), first, second));
  if (plan.cp_chunk_rule() != kCpChunkRule) {
    return absl::FailedPreconditionError(
        absl::StrCat("the plan's CP chunk rule is ", plan.cp_chunk_rule(),
                     "; this library re-plans only under rule ", kCpChunkRule));
  }
  return ReplaceBySplit(plan, microbatch, first, second);
}

}  // namespace planner
}  // namespace lockstep
