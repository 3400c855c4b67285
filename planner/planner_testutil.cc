#include "planner/planner_testutil.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace lockstep {
namespace planner {

std::string DistributionName(LengthDistribution distribution) {
  switch (distribution) {
    case LengthDistribution::kUniform:
      return "uniform";
    case LengthDistribution::kLongTail:
      return "long-tail";
    case LengthDistribution::kAllEqual:
      return "all-equal";
  }
  return "unknown";
}

std::vector<Sequence> RandomBatch(const RandomBatchOptions& options) {
  std::mt19937_64 rng(options.seed);
  std::uniform_int_distribution<int64_t> uniform(1, options.max_length);
  std::lognormal_distribution<double> long_tail(
      std::log(std::max(1.0, static_cast<double>(options.max_length) / 32.0)), 1.25);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const int64_t equal = options.equal_length > 0 ? options.equal_length : uniform(rng);
  std::vector<Sequence> batch(options.num_sequences);
  for (int64_t i = 0; i < options.num_sequences; ++i) {
    Sequence& s = batch[i];
    s.id = 1000 + i;
    switch (options.distribution) {
      case LengthDistribution::kUniform:
        s.num_tokens = uniform(rng);
        break;
      case LengthDistribution::kLongTail:
        s.num_tokens = std::clamp<int64_t>(std::llround(long_tail(rng)), 1, options.max_length);
        break;
      case LengthDistribution::kAllEqual:
        s.num_tokens = equal;
        break;
    }
    if (options.weighted_fraction > 0 && unit(rng) < options.weighted_fraction) {
      s.loss_weights.resize(s.num_tokens);
      const bool mask = unit(rng) < 0.5;
      for (float& w : s.loss_weights) {
        w = mask ? (unit(rng) < 0.7 ? 1.0f : 0.0f) : static_cast<float>(unit(rng));
      }
      // Keep at least one positive weight, so per-sequence-mean normalisation is defined.
      s.loss_weights[0] = std::max(s.loss_weights[0], 0.5f);
    }
  }
  return batch;
}

std::vector<Sequence> DeterminismBatch(uint64_t seed) {
  RandomBatchOptions options;
  options.distribution = LengthDistribution::kLongTail;
  options.num_sequences = 2000;
  options.max_length = 32768;
  options.seed = seed;
  options.weighted_fraction = 0.1;
  return RandomBatch(options);
}

PlanOptions DeterminismOptions() {
  PlanOptions options;
  options.max_tokens_per_microbatch = 65536;
  options.cp_size = 2;
  return options;
}

PlanOptions InOrder(int64_t budget, int cp) {
  PlanOptions options = PlanOptions::Of(budget, cp);
  options.packing = PACKING_IN_ORDER;
  return options;
}

PlanOptions Normalized(int64_t budget, LossNormalization norm, int cp) {
  PlanOptions options = PlanOptions::Of(budget, cp);
  options.loss_normalization = norm;
  return options;
}

}  // namespace planner
}  // namespace lockstep
