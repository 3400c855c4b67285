// planner/planner_testutil.h
//
// Random batches for the planner's property tests, determinism tests and benchmark: sequence
// lengths drawn from a named distribution with a fixed seed (std::mt19937_64), so that a test
// case is reproducible from (distribution, size, max length, seed).
//
// Distributions (lengths always within [1, max_length]):
//   - kUniform: uniform on [1, max_length];
//   - kLongTail: log-normal with median max_length / 32 and sigma 1.25, clipped to
//     [1, max_length] (most sequences short, a few near the maximum, like chat/pretraining data);
//   - kAllEqual: every sequence has the same length, drawn once uniformly from [1, max_length]
//     unless RandomBatchOptions::equal_length fixes it.
//
// Thread-safety: stateless.

#ifndef LOCKSTEP_PLANNER_PLANNER_TESTUTIL_H_
#define LOCKSTEP_PLANNER_PLANNER_TESTUTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "planner/planner.h"

namespace lockstep {
namespace planner {

enum class LengthDistribution { kUniform, kLongTail, kAllEqual };

std::string DistributionName(LengthDistribution distribution);

struct RandomBatchOptions {
  LengthDistribution distribution = LengthDistribution::kUniform;
  int64_t num_sequences = 100;
  int64_t max_length = 1024;
  uint64_t seed = 1;
  // kAllEqual: the common length; 0 draws it. Default: 0.
  int64_t equal_length = 0;
  // Fraction of sequences that get per-token loss weights (random 0/1 masks and values in
  // [0, 1)); the others have none (weight 1). Default: 0.
  double weighted_fraction = 0;
};

// A batch drawn as described above; ids are 1000 + index.
std::vector<Sequence> RandomBatch(const RandomBatchOptions& options);

// The batch and options of the cross-process determinism tests: 2000 long-tail sequences (max
// 32768 tokens, 10% with loss weights) from `seed`, planned with a 65536-token budget at CP 2.
std::vector<Sequence> DeterminismBatch(uint64_t seed);
PlanOptions DeterminismOptions();

// PlanOptions::Of(budget, cp) with in-order packing.
PlanOptions InOrder(int64_t budget, int cp = 1);
// PlanOptions::Of(budget, cp) with loss normalization `norm`.
PlanOptions Normalized(int64_t budget, LossNormalization norm, int cp = 1);

}  // namespace planner
}  // namespace lockstep

#endif  // LOCKSTEP_PLANNER_PLANNER_TESTUTIL_H_
