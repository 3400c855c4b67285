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
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace lockstep {
namespace planner {
namespace {

// Above this many distinct length values the buckets are indexed by rank among the distinct
// lengths (a sort) instead of by length (a counting sort), to bound memory.
constexpr int64_t kMaxDirectLength = int64_t{1} << 22;

std::string Name(absl::Span<const Sequence> batch, size_t index) {
  return absl::StrCat("sequence ", index, " (id ", batch[index].id, ")");
}

absl::Status ValidateOptions(const PlanOptions& options) {
  const int64_t budget = options.max_tokens_per_microbatch;
  if (budget <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens_per_microbatch is ", budget, "; it must be positive"));
  }
  if (options.cp_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cp_size is ", options.cp_size, "; it must be positive"));
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

// Checks every sequence and computes the loss scales (see LossNormalization): one per sequence
// for LOSS_SEQUENCE_MEAN, else a single one shared by every sequence.
absl::Status ValidateBatchAndScale(absl::Span<const Sequence> batch, const PlanOptions& options,
                                   std::vector<double>& scale, int64_t& total_tokens,
                                   double& weight_total) {
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
  std::vector<double> sequence_weight(per_sequence ? batch.size() : 0);
  total_tokens = 0;
  weight_total = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Sequence& s = batch[i];
    if (s.num_tokens <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(Name(batch, i), " has ", s.num_tokens,
                                                     " tokens; every sequence needs at least 1"));
    }
    if (s.num_tokens > budget) {
      return absl::InvalidArgumentError(absl::StrCat(Name(batch, i), " has ", s.num_tokens,
                                                     " tokens; a microbatch holds at most ", budget,
                                                     " (max_tokens_per_microbatch)"));
    }
    total_tokens += s.num_tokens;
    double w = 0;
    if (s.loss_weights.empty()) {
      w = static_cast<double>(s.num_tokens);
    } else {
      if (static_cast<int64_t>(s.loss_weights.size()) != s.num_tokens) {
        return absl::InvalidArgumentError(absl::StrCat(Name(batch, i), " has ",
                                                       s.loss_weights.size(), " loss weights for ",
                                                       s.num_tokens, " tokens"));
      }
      for (size_t t = 0; t < s.loss_weights.size(); ++t) {
        const float x = s.loss_weights[t];
        if (!(std::isfinite(x) && x >= 0)) {
          return absl::InvalidArgumentError(
              absl::StrCat(Name(batch, i), ": loss weight of token ", t, " is ", x,
                           "; loss weights must be finite and non-negative"));
        }
        w += x;
      }
    }
    if (per_sequence) {
      if (w == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(Name(batch, i),
                         ": its loss weights sum to 0; per-sequence-mean normalisation divides "
                         "by each sequence's sum"));
      }
      sequence_weight[i] = w;
    }
    weight_total += w;
  }
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
      scale.resize(batch.size());
      for (size_t i = 0; i < batch.size(); ++i) {
        scale[i] = 1.0 / (sequence_weight[i] * static_cast<double>(batch.size()));
      }
      break;
  }
  return absl::OkStatus();
}

// A packing: bin b holds items[bin_start[b] .. bin_start[b + 1]) (indices into the batch).
struct Packing {
  std::vector<int32_t> items;
  std::vector<int64_t> bin_start{0};
  int64_t bins() const { return static_cast<int64_t>(bin_start.size()) - 1; }
};

// Number of microbatches that filling in input order needs (see PackInOrder).
int64_t InOrderBins(absl::Span<const Sequence> batch, int64_t budget) {
  int64_t bins = 0, fill = budget;
  for (const Sequence& s : batch) {
    if (fill + s.num_tokens > budget) {
      ++bins;
      fill = 0;
    }
    fill += s.num_tokens;
  }
  return bins;
}

Packing PackInOrder(absl::Span<const Sequence> batch, int64_t budget) {
  Packing p;
  p.items.reserve(batch.size());
  int64_t fill = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (fill + batch[i].num_tokens > budget) {
      p.bin_start.push_back(static_cast<int64_t>(p.items.size()));
      fill = 0;
    }
    fill += batch[i].num_tokens;
    p.items.push_back(static_cast<int32_t>(i));
  }
  p.bin_start.push_back(static_cast<int64_t>(p.items.size()));
  return p;
}

// A set of keys in [0, size) answering "largest member <= k" in a few word operations: a bitset
// with summary levels (bit j of level l + 1 says whether word j of level l is non-zero).
class KeySet {
 public:
  explicit KeySet(int64_t size) {
    int64_t bits = std::max<int64_t>(size, 1);
    do {
      const int64_t words = (bits + 63) / 64;
      levels_.emplace_back(words, 0);
      bits = words;
    } while (bits > 1);
  }

  void Insert(int64_t key) {
    for (auto& level : levels_) {
      level[key >> 6] |= uint64_t{1} << (key & 63);
      key >>= 6;
    }
  }

  void Erase(int64_t key) {
    for (auto& level : levels_) {
      uint64_t& word = level[key >> 6];
      word &= ~(uint64_t{1} << (key & 63));
      if (word != 0) return;
      key >>= 6;
    }
  }

  // The largest member <= key, or -1.
  int64_t FindPrev(int64_t key) const {
    size_t level = 0;
    int64_t pos = key;
    while (true) {
      if (pos < 0) return -1;
      const int bit = static_cast<int>(pos & 63);
      const uint64_t mask = bit == 63 ? ~uint64_t{0} : (uint64_t{1} << (bit + 1)) - 1;
      const uint64_t word = levels_[level][pos >> 6] & mask;
      if (word != 0) {
        pos = (pos & ~int64_t{63}) + 63 - __builtin_clzll(word);
        break;
      }
      if (level + 1 == levels_.size()) return -1;
      pos = (pos >> 6) - 1;
      ++level;
    }
    while (level > 0) {
      --level;
      pos = pos * 64 + 63 - __builtin_clzll(levels_[level][pos]);
    }
    return pos;
  }

 private:
  std::vector<std::vector<uint64_t>> levels_;
};

// Note [FFD by length buckets]
// First-fit-decreasing (items longest first, ties in input order, each into the first bin with
// room) fills bin 1 with exactly the items that a greedy pass "take the longest remaining item
// that still fits" picks: FFD visits items in decreasing order and puts one into bin 1 iff it
// fits what bin 1 has left, and what is left only shrinks. Bin 2 is then the same pass over the
// rest, and so on. So FFD never has to scan bins: bucket the items by length (a counting sort,
// stable, so each bucket is a queue in input order), keep the set of non-empty lengths in a
// KeySet, and fill one bin at a time by asking for the largest non-empty length <= the bin's
// room. That is one query per item plus one per bin: O(n + bins + distinct lengths).
Packing PackFirstFitDecreasing(absl::Span<const Sequence> batch, int64_t budget) {
  const size_t n = batch.size();
  int64_t max_length = 0;
  for (const Sequence& s : batch) max_length = std::max(max_length, s.num_tokens);
  // Keys: the length itself, or its rank among the distinct lengths when lengths are huge.
  const bool direct = max_length <= kMaxDirectLength;
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
  std::vector<int64_t> head(keys + 1, 0);
  std::vector<int64_t> item_key(direct ? 0 : n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t k = key_of(batch[i].num_tokens);
    if (!direct) item_key[i] = k;
    ++head[k];
  }
  KeySet nonempty(keys);
  int64_t next = 0;
  for (int64_t k = keys - 1; k >= 0; --k) {
    const int64_t count = head[k];
    head[k] = next;
    next += count;
    if (count > 0) nonempty.Insert(k);
  }
  std::vector<int32_t> order(n);
  {
    std::vector<int64_t> fill = head;
    for (size_t i = 0; i < n; ++i) {
      const int64_t k = direct ? batch[i].num_tokens : item_key[i];
      order[fill[k]++] = static_cast<int32_t>(i);
    }
  }
  // Buckets lie longest first, so bucket k ends where bucket k - 1 (the next shorter) starts.
  std::vector<int64_t> bucket_end(keys);
  for (int64_t k = 0; k < keys; ++k) bucket_end[k] = k == 0 ? static_cast<int64_t>(n) : head[k - 1];

  Packing p;
  p.items.reserve(n);
  size_t placed = 0;
  while (placed < n) {
    int64_t room = budget;
    while (room > 0) {
      const int64_t k = nonempty.FindPrev(key_for_room(room));
      if (k < 0) break;
      const int32_t item = order[head[k]++];
      if (head[k] == bucket_end[k]) nonempty.Erase(k);
      p.items.push_back(item);
      room -= length_of(k);
      ++placed;
    }
    p.bin_start.push_back(static_cast<int64_t>(p.items.size()));
  }
  return p;
}

// One packed sequence (or part of one) of a microbatch under construction.
struct Part {
  int32_t batch_index;
  int64_t id;
  int64_t token_begin;
  int64_t num_tokens;
  double loss_scale;
};

// Fills `mb` with `parts` packed in order and sharded over `cp` ranks (see planner.h).
void BuildMicrobatch(const std::vector<Part>& parts, int cp, Microbatch& mb) {
  const int chunks = 2 * cp;
  const int n = static_cast<int>(parts.size());
  mb.mutable_batch_index()->Reserve(n);
  mb.mutable_sequence_id()->Reserve(n);
  mb.mutable_token_begin()->Reserve(n);
  mb.mutable_cu_seqlens()->Reserve(n + 1);
  mb.mutable_loss_scale()->Reserve(n);
  mb.add_cu_seqlens(0);
  int64_t offset = 0;
  for (const Part& part : parts) {
    mb.add_batch_index(part.batch_index);
    mb.add_sequence_id(part.id);
    mb.add_token_begin(part.token_begin);
    offset += part.num_tokens;
    mb.add_cu_seqlens(offset);
    mb.add_loss_scale(part.loss_scale);
  }
  mb.set_num_tokens(offset);
  // A rank owns at most two pieces per sequence, and at most `offset` pieces in all: reserving
  // that once per field avoids regrowing them (allocation dominates the cost of large plans).
  const int max_pieces = static_cast<int>(std::min<int64_t>(2 * int64_t{n}, offset));
  std::vector<CpShard*> shards(cp);
  for (int r = 0; r < cp; ++r) {
    shards[r] = mb.add_shards();
    shards[r]->set_cp_rank(r);
    shards[r]->mutable_piece_sequence()->Reserve(max_pieces);
    shards[r]->mutable_piece_chunk()->Reserve(max_pieces);
    shards[r]->mutable_piece_begin()->Reserve(max_pieces);
    shards[r]->mutable_piece_end()->Reserve(max_pieces);
  }
  // Leftover tokens lengthen chunks in the order F(0), B(0), F(1), B(1), ... (F(r): rank r's
  // front chunk r, B(r): its back chunk 2cp-1-r), continuing from sequence to sequence. A rank
  // thus gets its leftovers in mirrored pairs, which keeps a sequence's chunk layout symmetric
  // (so causal work stays proportional to tokens), and the ranks take turns across sequences.
  int turn = 0;  // position in the cycle of 2 * cp leftover slots
  std::vector<int64_t> shard_tokens(cp, 0);
  for (int k = 0; k < n; ++k) {
    const int64_t length = parts[k].num_tokens;
    const int64_t base = length / chunks;
    const int remainder = static_cast<int>(length % chunks);
    int64_t begin = mb.cu_seqlens(k);
    for (int j = 0; j < chunks; ++j) {
      const bool front = j < cp;
      const int rank = front ? j : chunks - 1 - j;
      const int slot = 2 * rank + (front ? 0 : 1);
      const int64_t size = base + ((slot - turn + chunks) % chunks < remainder ? 1 : 0);
      if (size > 0) {
        CpShard& shard = *shards[rank];
        shard.add_piece_sequence(k);
        shard.add_piece_chunk(j);
        shard.add_piece_begin(begin);
        shard.add_piece_end(begin + size);
        shard_tokens[rank] += size;
      }
      begin += size;
    }
    turn = (turn + remainder) % chunks;
  }
  for (int r = 0; r < cp; ++r) shards[r]->set_num_tokens(shard_tokens[r]);
}

}  // namespace

absl::StatusOr<Plan> PlanMicrobatches(absl::Span<const Sequence> batch,
                                      const PlanOptions& options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  std::vector<double> scale;
  int64_t total_tokens = 0;
  double weight_total = 0;
  if (absl::Status s = ValidateBatchAndScale(batch, options, scale, total_tokens, weight_total);
      !s.ok()) {
    return s;
  }
  const int64_t budget = options.max_tokens_per_microbatch;
  Packing packing;
  PackingPolicy applied = options.packing;
  if (options.packing == PACKING_IN_ORDER) {
    packing = PackInOrder(batch, budget);
  } else {
    packing = PackFirstFitDecreasing(batch, budget);
    if (InOrderBins(batch, budget) < packing.bins()) {
      packing = PackInOrder(batch, budget);
      applied = PACKING_IN_ORDER;
    }
  }

  Plan plan;
  PlanLimits& limits = *plan.mutable_limits();
  limits.set_max_tokens_per_microbatch(budget);
  limits.set_cp_size(options.cp_size);
  limits.set_packing(options.packing);
  limits.set_loss_normalization(options.loss_normalization);
  plan.set_packing_applied(applied);
  plan.set_num_sequences(static_cast<int32_t>(batch.size()));
  plan.set_num_tokens(total_tokens);
  plan.set_loss_weight_total(weight_total);
  plan.mutable_microbatches()->Reserve(static_cast<int>(packing.bins()));
  std::vector<Part> parts;
  for (int64_t b = 0; b < packing.bins(); ++b) {
    parts.clear();
    for (int64_t x = packing.bin_start[b]; x < packing.bin_start[b + 1]; ++x) {
      const int32_t i = packing.items[x];
      parts.push_back({i, batch[i].id, 0, batch[i].num_tokens, scale[scale.size() == 1 ? 0 : i]});
    }
    BuildMicrobatch(parts, options.cp_size, *plan.add_microbatches());
  }
  return plan;
}

absl::StatusOr<Plan> SplitMicrobatch(const Plan& plan, int microbatch) {
  if (microbatch < 0 || microbatch >= plan.microbatches_size()) {
    return absl::InvalidArgumentError(absl::StrCat("microbatch ", microbatch,
                                                   " is not in the plan, which has ",
                                                   plan.microbatches_size(), " microbatches"));
  }
  const int cp = plan.limits().cp_size();
  if (cp <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("the plan's cp_size is ", cp));
  }
  const Microbatch& mb = plan.microbatches(microbatch);
  const int n = mb.batch_index_size();
  if (n == 0 || mb.cu_seqlens_size() != n + 1 || mb.sequence_id_size() != n ||
      mb.token_begin_size() != n || mb.loss_scale_size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("microbatch ", microbatch, " is malformed: ", n, " batch indices, ",
                     mb.sequence_id_size(), " ids, ", mb.token_begin_size(), " token begins, ",
                     mb.loss_scale_size(), " loss scales, ", mb.cu_seqlens_size(), " boundaries"));
  }
  std::vector<Part> first, second;
  auto part = [&](int k) {
    return Part{mb.batch_index(k), mb.sequence_id(k), mb.token_begin(k),
                mb.cu_seqlens(k + 1) - mb.cu_seqlens(k), mb.loss_scale(k)};
  };
  if (n >= 2) {
    // The sequence boundary closest to half the tokens; the earlier one on a tie.
    const int64_t total = mb.cu_seqlens(n);
    int cut = 1;
    for (int k = 2; k < n; ++k) {
      if (std::llabs(2 * mb.cu_seqlens(k) - total) < std::llabs(2 * mb.cu_seqlens(cut) - total)) {
        cut = k;
      }
    }
    for (int k = 0; k < n; ++k) (k < cut ? first : second).push_back(part(k));
  } else {
    const Part whole = part(0);
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
  }
  Plan out;
  *out.mutable_limits() = plan.limits();
  out.set_packing_applied(plan.packing_applied());
  out.set_num_sequences(plan.num_sequences());
  out.set_num_tokens(plan.num_tokens());
  out.set_loss_weight_total(plan.loss_weight_total());
  out.set_splits(plan.splits() + 1);
  out.mutable_microbatches()->Reserve(plan.microbatches_size() + 1);
  for (int m = 0; m < plan.microbatches_size(); ++m) {
    if (m == microbatch) {
      BuildMicrobatch(first, cp, *out.add_microbatches());
      BuildMicrobatch(second, cp, *out.add_microbatches());
    } else {
      *out.add_microbatches() = plan.microbatches(m);
    }
  }
  return out;
}

std::string SerializePlan(const Plan& plan) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.SetSerializationDeterministic(true);
    plan.SerializeToCodedStream(&out);
  }
  return bytes;
}

Sha256Digest PlanDigest(const Plan& plan) {
  return Sha256Framed({"lockstep/planner/plan/v1", SerializePlan(plan)});
}

std::vector<int64_t> PositionIds(const Microbatch& microbatch) {
  std::vector<int64_t> positions;
  positions.reserve(microbatch.num_tokens());
  for (int k = 0; k + 1 < microbatch.cu_seqlens_size(); ++k) {
    const int64_t start = k < microbatch.token_begin_size() ? microbatch.token_begin(k) : 0;
    for (int64_t t = microbatch.cu_seqlens(k); t < microbatch.cu_seqlens(k + 1); ++t) {
      positions.push_back(start + t - microbatch.cu_seqlens(k));
    }
  }
  return positions;
}

std::vector<int64_t> ShardTokenIndices(const Microbatch& microbatch, int cp_rank) {
  const CpShard& shard = microbatch.shards(cp_rank);
  std::vector<int64_t> indices;
  indices.reserve(shard.num_tokens());
  for (int p = 0; p < shard.piece_begin_size(); ++p) {
    for (int64_t t = shard.piece_begin(p); t < shard.piece_end(p); ++t) indices.push_back(t);
  }
  return indices;
}

absl::StatusOr<std::vector<double>> TokenLossWeights(const Microbatch& microbatch,
                                                     absl::Span<const Sequence> batch) {
  const int n = microbatch.batch_index_size();
  if (microbatch.cu_seqlens_size() != n + 1 || microbatch.sequence_id_size() != n ||
      microbatch.token_begin_size() != n || microbatch.loss_scale_size() != n) {
    return absl::InvalidArgumentError("the microbatch's per-sequence arrays differ in length");
  }
  std::vector<double> weights;
  weights.reserve(microbatch.num_tokens());
  for (int k = 0; k < n; ++k) {
    const int32_t i = microbatch.batch_index(k);
    if (i < 0 || static_cast<size_t>(i) >= batch.size()) {
      return absl::InvalidArgumentError(absl::StrCat("packed sequence ", k, " refers to sequence ",
                                                     i, "; the batch has ", batch.size()));
    }
    const Sequence& s = batch[i];
    const int64_t begin = microbatch.token_begin(k);
    const int64_t count = microbatch.cu_seqlens(k + 1) - microbatch.cu_seqlens(k);
    if (s.id != microbatch.sequence_id(k) || begin < 0 || count < 0 ||
        begin + count > s.num_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("packed sequence ", k, " (tokens [", begin, ", ", begin + count, ") of id ",
                       microbatch.sequence_id(k), ") does not match ", Name(batch, i), " with ",
                       s.num_tokens, " tokens"));
    }
    const double scale = microbatch.loss_scale(k);
    for (int64_t t = begin; t < begin + count; ++t) {
      weights.push_back((s.loss_weights.empty() ? 1.0 : s.loss_weights[t]) * scale);
    }
  }
  return weights;
}

double PackingEfficiency(const Plan& plan) {
  const double capacity = static_cast<double>(plan.microbatches_size()) *
                          static_cast<double>(plan.limits().max_tokens_per_microbatch());
  return capacity > 0 ? static_cast<double>(plan.num_tokens()) / capacity : 0.0;
}

}  // namespace planner
}  // namespace lockstep
