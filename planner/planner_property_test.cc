// Property tests of the planner over thousands of random batches (fixed seeds; lengths from
// uniform, long-tail and all-equal distributions; random budgets, CP sizes, policies,
// normalisations and per-token weights). For every plan, and again after random re-planning
// splits, they check with oracles written here, independent of VerifyPlan's range logic:
//   - every token of every sequence appears exactly once across microbatches x CP shards;
//   - no microbatch exceeds its budget;
//   - positions restart per sequence and match cu_seqlens and the token's place in its sequence;
//   - CP balance within one chunk of optimal, measured in tokens (no rank owns more than
//     ceil(mean) + 1 tokens of a microbatch, and a non-empty chunk has at least one token;
//     max - min <= 2), and in causal-attention work (a token at position p of its packed
//     sequence costs p + 1) where chunks are equal: every rank then does exactly the same work;
//   - the weights reproduce the unsplit loss of a toy per-token loss to 1e-6;
// plus: the bucketed first-fit-decreasing equals a plain O(n x bins) FFD, and the default policy
// never needs more microbatches than in-order filling.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_testutil.h"
#include "gtest/gtest.h"
#include "planner/plan_check.h"
#include "planner/planner.h"
#include "planner/planner_testutil.h"

namespace lockstep {
namespace planner {
namespace {

constexpr int kBatchesPerDistribution = 1000;

// The toy per-token loss: any fixed function of (sequence id, position) will do.
double ToyLoss(int64_t id, int64_t position) {
  return 1.5 + std::sin(0.1 * static_cast<double>(id) + 0.37 * static_cast<double>(position));
}

double Weight(const Sequence& s, int64_t t) {
  return s.loss_weights.empty() ? 1.0 : s.loss_weights[t];
}

// The step's loss computed on the unpacked, unsplit batch, straight from the definitions.
double UnsplitLoss(const std::vector<Sequence>& batch, LossNormalization norm) {
  double weighted = 0, weights = 0, per_sequence = 0;
  for (const Sequence& s : batch) {
    double sw = 0, swl = 0;
    for (int64_t t = 0; t < s.num_tokens; ++t) {
      sw += Weight(s, t);
      swl += Weight(s, t) * ToyLoss(s.id, t);
    }
    weighted += swl;
    weights += sw;
    per_sequence += swl / sw;
  }
  switch (norm) {
    case LOSS_TOKEN_MEAN:
      return weighted / weights;
    case LOSS_SUM:
      return weighted;
    default:
      return per_sequence / static_cast<double>(batch.size());
  }
}

// Checks the plan token by token; returns the loss it gives (sum over microbatches and CP
// shards of weight x toy loss).
double CheckTokens(const Plan& plan, const std::vector<Sequence>& batch,
                   int* equal_chunk_sequences) {
  const int64_t budget = plan.limits().max_tokens_per_microbatch();
  const int cp = plan.limits().cp_size();
  std::vector<std::vector<int>> seen(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) seen[i].assign(batch[i].num_tokens, 0);
  double loss = 0;
  for (int m = 0; m < plan.microbatches_size(); ++m) {
    const Microbatch& mb = plan.microbatches(m);
    EXPECT_LE(mb.num_tokens(), budget) << "microbatch " << m;
    absl::StatusOr<std::vector<int64_t>> positions_or = PositionIds(mb);
    absl::StatusOr<std::vector<double>> weights_or = TokenLossWeights(mb, batch);
    if (!positions_or.ok() || !weights_or.ok()) {
      ADD_FAILURE() << "microbatch " << m << ": " << positions_or.status() << "; "
                    << weights_or.status();
      return std::numeric_limits<double>::quiet_NaN();
    }
    const std::vector<int64_t> positions = *std::move(positions_or);
    const std::vector<double> weights = *std::move(weights_or);
    EXPECT_EQ(static_cast<int64_t>(positions.size()), mb.num_tokens());
    // Packed token -> packed sequence, and the positions' consistency with the boundaries.
    std::vector<int> owner(mb.num_tokens());
    for (int k = 0; k < mb.batch_index_size(); ++k) {
      for (int64_t t = mb.cu_seqlens(k); t < mb.cu_seqlens(k + 1); ++t) {
        owner[t] = k;
        EXPECT_EQ(positions[t], TokenBegin(mb, k) + (t - mb.cu_seqlens(k)));
      }
    }
    EXPECT_EQ(mb.shard_cp_rank_size(), cp);
    EXPECT_EQ(mb.shard_num_tokens_size(), cp);
    EXPECT_EQ(mb.shard_num_pieces_size(), cp);
    const int64_t total = mb.num_tokens();
    int64_t min_tokens = total, max_tokens = 0;
    // Causal work per packed sequence and rank.
    const int n = mb.batch_index_size();
    std::vector<std::vector<double>> work(n, std::vector<double>(cp, 0.0));
    for (int r = 0; r < cp; ++r) {
      EXPECT_EQ(mb.shard_cp_rank(r), r);
      const int64_t shard_tokens = mb.shard_num_tokens(r);
      absl::StatusOr<std::vector<int64_t>> mine_or = ShardTokenIndices(plan, m, r);
      if (!mine_or.ok()) {
        ADD_FAILURE() << "microbatch " << m << " rank " << r << ": " << mine_or.status();
        return std::numeric_limits<double>::quiet_NaN();
      }
      const std::vector<int64_t> mine = *std::move(mine_or);
      EXPECT_EQ(static_cast<int64_t>(mine.size()), shard_tokens);
      // The stored piece count: a sequence of at least 2 x CP tokens gives every rank two
      // non-empty chunks; a shorter one has chunks of at most one token, one piece per token.
      std::vector<int64_t> owned(mb.batch_index_size(), 0);
      for (int64_t t : mine) ++owned[owner[t]];
      int64_t expected_pieces = 0;
      for (int k = 0; k < mb.batch_index_size(); ++k) {
        const bool long_sequence = mb.cu_seqlens(k + 1) - mb.cu_seqlens(k) >= 2 * cp;
        expected_pieces += long_sequence ? 2 : owned[k];
      }
      EXPECT_EQ(mb.shard_num_pieces(r), expected_pieces) << "microbatch " << m << " rank " << r;
      // Token balance: at most one token past the optimum ceil(mean) (a chunk has >= 1 token).
      EXPECT_LE(shard_tokens, (total + cp - 1) / cp + 1) << "microbatch " << m << " rank " << r;
      min_tokens = std::min(min_tokens, shard_tokens);
      max_tokens = std::max(max_tokens, shard_tokens);
      for (int64_t t : mine) {
        const int k = owner[t];
        const int32_t i = mb.batch_index(k);
        ++seen[i][positions[t]];
        loss += weights[t] * ToyLoss(batch[i].id, positions[t]);
        work[k][r] += static_cast<double>(t - mb.cu_seqlens(k) + 1);
      }
    }
    EXPECT_LE(max_tokens - min_tokens, 2) << "microbatch " << m;
    // Causal work: when a packed sequence splits into 2 x CP equal chunks, pairing chunk i with
    // chunk 2CP-1-i gives every rank exactly the same work.
    for (int k = 0; k < n; ++k) {
      if ((mb.cu_seqlens(k + 1) - mb.cu_seqlens(k)) % (2 * cp) != 0) continue;
      ++*equal_chunk_sequences;
      for (int r = 1; r < cp; ++r) {
        EXPECT_EQ(work[k][r], work[k][0])
            << "microbatch " << m << " packed sequence " << k << " rank " << r;
      }
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    for (int64_t t = 0; t < batch[i].num_tokens; ++t) {
      if (seen[i][t] != 1) {
        ADD_FAILURE() << "token " << t << " of sequence " << i << " appears " << seen[i][t]
                      << " times";
        return loss;
      }
    }
  }
  return loss;
}

// First-fit-decreasing written the plain way: sort, then scan the bins for each item.
std::vector<std::vector<int32_t>> PlainFfd(const std::vector<Sequence>& batch, int64_t budget) {
  std::vector<int32_t> order(batch.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return batch[a].num_tokens > batch[b].num_tokens; });
  std::vector<std::vector<int32_t>> bins;
  std::vector<int64_t> room;
  for (int32_t i : order) {
    size_t b = 0;
    while (b < bins.size() && room[b] < batch[i].num_tokens) ++b;
    if (b == bins.size()) {
      bins.emplace_back();
      room.push_back(budget);
    }
    bins[b].push_back(i);
    room[b] -= batch[i].num_tokens;
  }
  return bins;
}

int64_t PlainInOrderBins(const std::vector<Sequence>& batch, int64_t budget) {
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

class PropertyTest : public ::testing::TestWithParam<LengthDistribution> {};

TEST_P(PropertyTest, RandomBatchesGiveValidBalancedLossPreservingPlans) {
  const LengthDistribution distribution = GetParam();
  const int cp_sizes[] = {1, 2, 3, 4, 8};
  const LossNormalization norms[] = {LOSS_TOKEN_MEAN, LOSS_SUM, LOSS_SEQUENCE_MEAN};
  int splits = 0, fallbacks = 0, equal_chunk = 0;
  for (int c = 0; c < kBatchesPerDistribution; ++c) {
    const uint64_t seed = 7919 * static_cast<uint64_t>(c) + static_cast<uint64_t>(distribution);
    std::mt19937_64 rng(seed);
    const int cp = cp_sizes[rng() % 5];
    const int64_t budget = 2 * cp + static_cast<int64_t>(rng() % 1024);
    const int64_t max_length = 1 + static_cast<int64_t>(rng() % budget);
    RandomBatchOptions batch_options;
    batch_options.distribution = distribution;
    batch_options.num_sequences = 1 + static_cast<int64_t>(rng() % 80);
    batch_options.max_length = max_length;
    batch_options.seed = seed;
    batch_options.weighted_fraction = 0.3;
    const std::vector<Sequence> batch = RandomBatch(batch_options);
    const PackingPolicy packing = rng() % 4 == 0 ? PACKING_IN_ORDER : PACKING_FIRST_FIT_DECREASING;
    const LossNormalization norm = norms[rng() % 3];
    PlanOptions options = Normalized(budget, norm, cp);
    options.packing = packing;
    SCOPED_TRACE(absl::StrCat(DistributionName(distribution), " case ", c, ": ", batch.size(),
                              " sequences, budget ", budget, ", cp ", cp, ", packing ",
                              options.packing, ", loss ", options.loss_normalization));
    absl::StatusOr<Plan> plan = PlanMicrobatches(batch, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(VerifyPlan(*plan, batch).ok()) << VerifyPlan(*plan, batch);
    const double reference = UnsplitLoss(batch, options.loss_normalization);
    const double tolerance = 1e-6 * std::max(1.0, std::abs(reference));
    EXPECT_NEAR(CheckTokens(*plan, batch, &equal_chunk), reference, tolerance);

    // Packing: bucketed FFD is FFD; the default never needs more microbatches than in order.
    const int64_t in_order = PlainInOrderBins(batch, budget);
    if (options.packing == PACKING_FIRST_FIT_DECREASING) {
      EXPECT_LE(plan->microbatches_size(), in_order);
      const std::vector<std::vector<int32_t>> ffd = PlainFfd(batch, budget);
      if (plan->packing_applied() == PACKING_FIRST_FIT_DECREASING) {
        ASSERT_EQ(plan->microbatches_size(), static_cast<int>(ffd.size()));
        for (size_t b = 0; b < ffd.size(); ++b) {
          const auto& got = plan->microbatches(b).batch_index();
          EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()), ffd[b]) << "microbatch " << b;
        }
      } else {
        ++fallbacks;
        EXPECT_LT(in_order, static_cast<int64_t>(ffd.size()));
        EXPECT_EQ(plan->microbatches_size(), in_order);
      }
    } else {
      EXPECT_EQ(plan->microbatches_size(), in_order);
    }

    // Re-planning: up to three random splits, each keeping every property and the loss.
    Plan current = *plan;
    for (int s = 0; s < 3; ++s) {
      const int m = static_cast<int>(rng() % current.microbatches_size());
      absl::StatusOr<Plan> split = SplitMicrobatch(current, m);
      if (!split.ok()) {
        // Only a single sequence part of at most 2 x CP tokens may refuse.
        const Microbatch& mb = current.microbatches(m);
        EXPECT_EQ(split.status().code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_EQ(mb.batch_index_size(), 1);
        EXPECT_LE(mb.num_tokens(), 2 * cp);
        continue;
      }
      ++splits;
      EXPECT_EQ(split->microbatches_size(), current.microbatches_size() + 1);
      ASSERT_TRUE(VerifyPlan(*split, batch).ok()) << VerifyPlan(*split, batch);
      EXPECT_NEAR(CheckTokens(*split, batch, &equal_chunk), reference, tolerance)
          << "after split " << s;
      current = *std::move(split);
    }
    if (::testing::Test::HasFailure()) return;
  }
  // The generators must actually exercise re-planning.
  EXPECT_GT(splits, kBatchesPerDistribution);
  EXPECT_GT(equal_chunk, 0);
  RecordProperty("splits", splits);
  RecordProperty("ffd_fallbacks", fallbacks);
}

INSTANTIATE_TEST_SUITE_P(Distributions, PropertyTest,
                         ::testing::Values(LengthDistribution::kUniform,
                                           LengthDistribution::kLongTail,
                                           LengthDistribution::kAllEqual),
                         [](const ::testing::TestParamInfo<LengthDistribution>& info) {
                           std::string name = DistributionName(info.param);
                           name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
                           return name;
                         });

// Splitting one sequence again and again down to parts of 2 x CP tokens keeps the loss.
TEST(PropertyTest, RepeatedSplitsOfOneLongSequenceKeepTheLoss) {
  RandomBatchOptions batch_options;
  batch_options.distribution = LengthDistribution::kAllEqual;
  batch_options.num_sequences = 1;
  batch_options.max_length = 4096;
  batch_options.seed = 3;
  batch_options.equal_length = 1000;
  batch_options.weighted_fraction = 1.0;
  std::vector<Sequence> batch = RandomBatch(batch_options);
  for (LossNormalization norm : {LOSS_TOKEN_MEAN, LOSS_SUM, LOSS_SEQUENCE_MEAN}) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(Plan plan, PlanMicrobatches(batch, Normalized(1024, norm, 2)));
    const double reference = UnsplitLoss(batch, norm);
    int equal_chunk = 0;
    bool split_any = true;
    while (split_any) {
      split_any = false;
      for (int m = 0; m < plan.microbatches_size(); ++m) {
        absl::StatusOr<Plan> split = SplitMicrobatch(plan, m);
        if (split.ok()) {
          plan = *std::move(split);
          split_any = true;
          break;
        }
      }
    }
    ASSERT_TRUE(VerifyPlan(plan, batch).ok()) << VerifyPlan(plan, batch);
    for (const Microbatch& mb : plan.microbatches()) EXPECT_LE(mb.num_tokens(), 4);
    EXPECT_NEAR(CheckTokens(plan, batch, &equal_chunk), reference,
                1e-6 * std::max(1.0, std::abs(reference)));
  }
}

// The packing-efficiency target of the issue on one large long-tail batch (the benchmark
// reports it on more): first-fit-decreasing fills at least 95% of 64k-token microbatches.
TEST(PropertyTest, LongTailPacksAtLeast95Percent) {
  RandomBatchOptions batch_options;
  batch_options.distribution = LengthDistribution::kLongTail;
  batch_options.num_sequences = 20000;
  batch_options.max_length = 32768;
  batch_options.seed = 11;
  const std::vector<Sequence> batch = RandomBatch(batch_options);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Plan plan, PlanMicrobatches(batch, PlanOptions::Of(65536)));
  ASSERT_TRUE(VerifyPlan(plan, batch).ok()) << VerifyPlan(plan, batch);
  EXPECT_GE(PackingEfficiency(plan), 0.95);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Plan in_order, PlanMicrobatches(batch, InOrder(65536)));
  EXPECT_GE(PackingEfficiency(plan), PackingEfficiency(in_order));
}

}  // namespace
}  // namespace planner
}  // namespace lockstep
