// Fuzz target (base/fuzz_target.h) for plans received from elsewhere: VerifyPlan and the
// functions that read a plan (ShardPieces, ShardTokenIndices, PositionIds, TokenLossWeights,
// SplitMicrobatch).
//
// Input: a batch header, then a serialized Plan. Header: byte 0 gives the number of sequences
// (1 + b % 8); per sequence two bytes give its length (1 + v % 300); one more byte says which
// sequences carry per-token loss weights (bit i for sequence i).
//
// Oracle: every function returns a status, never aborts, overflows or reads out of bounds
// (ASan/UBSan under libFuzzer). When VerifyPlan accepts the plan: each microbatch's CP shards
// own every packed token exactly once; the token loss weights sum to what the normalisation
// promises (1 for token and sequence mean, the weight total for sum); and splitting any
// microbatch that can be split gives a plan VerifyPlan accepts.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/fuzz_target.h"
#include "planner/plan_check.h"
#include "planner/planner.h"

namespace lockstep {
namespace planner {
namespace {

constexpr int64_t kMaxListedInFuzz = int64_t{1} << 16;

std::vector<Sequence> BatchFromHeader(const uint8_t* data, size_t size, size_t& used) {
  used = 0;
  if (size < 1) return {};
  const int n = 1 + data[0] % 8;
  if (size < 2 + 2 * static_cast<size_t>(n)) return {};
  std::vector<Sequence> batch;
  const uint8_t weighted = data[1 + 2 * n];
  for (int i = 0; i < n; ++i) {
    const int64_t length = 1 + ((data[1 + 2 * i] << 8) | data[2 + 2 * i]) % 300;
    std::vector<float> weights;
    if (weighted & (1 << i)) {
      for (int64_t t = 0; t < length; ++t) weights.push_back(static_cast<float>((t * 7 + i) % 3));
      weights[0] = 1.0f;  // never all zero
    }
    batch.push_back(Sequence::Of(length, 1000 + i, std::move(weights)));
  }
  used = 2 + 2 * static_cast<size_t>(n);
  return batch;
}

std::string Header(absl::Span<const Sequence> batch) {
  std::string header(1, static_cast<char>(batch.size() - 1));
  uint8_t weighted = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t v = batch[i].num_tokens - 1;
    header.push_back(static_cast<char>(v >> 8));
    header.push_back(static_cast<char>(v & 0xff));
    if (!batch[i].loss_weights.empty()) weighted |= 1 << i;
  }
  header.push_back(static_cast<char>(weighted));
  return header;
}

// Calls every plan reader on a plan nobody checked: statuses only.
void ReadUnverified(const Plan& plan, absl::Span<const Sequence> batch) {
  const int microbatches = std::min(plan.microbatches_size(), 3);
  for (int m = -1; m <= microbatches; ++m) {
    for (int r = -1; r <= 2; ++r) (void)ShardPieces(plan, m, r);
    if (m < 0 || m >= plan.microbatches_size()) continue;
    const Microbatch& mb = plan.microbatches(m);
    // Listing is allowed up to kMaxListedTokens; keep the fuzzer's memory small.
    if (mb.num_tokens() <= kMaxListedInFuzz && mb.cu_seqlens_size() > 0 &&
        mb.cu_seqlens(mb.cu_seqlens_size() - 1) <= kMaxListedInFuzz) {
      (void)ShardTokenIndices(plan, m, 0);
      (void)PositionIds(mb);
      (void)TokenLossWeights(mb, batch);
    }
    (void)SplitMicrobatch(plan, m);
  }
}

double ExpectedWeightSum(const Plan& plan, absl::Span<const Sequence> batch) {
  if (plan.limits().loss_normalization() != LOSS_SUM) return 1.0;
  double total = 0;
  for (const Sequence& s : batch) {
    if (s.loss_weights.empty()) {
      total += static_cast<double>(s.num_tokens);
    } else {
      for (float w : s.loss_weights) total += w;
    }
  }
  return total;
}

void CheckVerified(const Plan& plan, absl::Span<const Sequence> batch) {
  const int cp = plan.limits().cp_size();
  double weight_sum = 0;
  for (int m = 0; m < plan.microbatches_size(); ++m) {
    const Microbatch& mb = plan.microbatches(m);
    std::vector<int> owners(mb.num_tokens(), 0);
    for (int r = 0; r < cp; ++r) {
      absl::StatusOr<std::vector<int64_t>> mine = ShardTokenIndices(plan, m, r);
      LOCKSTEP_FUZZ_CHECK(mine.ok(), mine.status().ToString());
      for (int64_t t : *mine) {
        LOCKSTEP_FUZZ_CHECK(t >= 0 && t < mb.num_tokens(), absl::StrCat("token index ", t));
        ++owners[t];
      }
    }
    for (size_t t = 0; t < owners.size(); ++t) {
      LOCKSTEP_FUZZ_CHECK(owners[t] == 1, absl::StrCat("microbatch ", m, " token ", t, " has ",
                                                       owners[t], " CP owners in a verified plan"));
    }
    absl::StatusOr<std::vector<int64_t>> positions = PositionIds(mb);
    LOCKSTEP_FUZZ_CHECK(
        positions.ok() && static_cast<int64_t>(positions->size()) == mb.num_tokens(),
        "PositionIds of a verified microbatch");
    absl::StatusOr<std::vector<double>> weights = TokenLossWeights(mb, batch);
    LOCKSTEP_FUZZ_CHECK(weights.ok(), weights.status().ToString());
    for (double w : *weights) weight_sum += w;
    absl::StatusOr<Plan> split = SplitMicrobatch(plan, m);
    if (split.ok()) {
      const absl::Status again = VerifyPlan(*split, batch);
      LOCKSTEP_FUZZ_CHECK(again.ok(), absl::StrCat("splitting microbatch ", m,
                                                   " of a verified plan: ", again.ToString()));
    }
  }
  const double want = ExpectedWeightSum(plan, batch);
  LOCKSTEP_FUZZ_CHECK(std::abs(weight_sum - want) <= 1e-9 * std::max(1.0, want),
                      absl::StrCat("token loss weights sum to ", weight_sum, ", expected ", want));
}

}  // namespace
}  // namespace planner

std::vector<std::string> FuzzSeeds() {
  using planner::Sequence;
  std::vector<std::string> seeds;
  const std::vector<std::vector<Sequence>> batches = {
      {Sequence::Of(37, 1000), Sequence::Of(5, 1001), Sequence::Of(120, 1002)},
      {Sequence::Of(3, 1000, {1, 0, 2}), Sequence::Of(64, 1001), Sequence::Of(9, 1002),
       Sequence::Of(1, 1003)},
  };
  for (std::vector<Sequence> batch : batches) {
    // Match the weights the header reconstructs.
    for (size_t i = 0; i < batch.size(); ++i) {
      if (batch[i].loss_weights.empty()) continue;
      batch[i].loss_weights.clear();
      for (int64_t t = 0; t < batch[i].num_tokens; ++t) {
        batch[i].loss_weights.push_back(static_cast<float>((t * 7 + i) % 3));
      }
      batch[i].loss_weights[0] = 1.0f;
    }
    for (const int cp : {1, 2, 3}) {
      for (const planner::LossNormalization norm :
           {planner::LOSS_TOKEN_MEAN, planner::LOSS_SUM, planner::LOSS_SEQUENCE_MEAN}) {
        planner::PlanOptions options;
        options.max_tokens_per_microbatch = 128;
        options.cp_size = cp;
        options.loss_normalization = norm;
        absl::StatusOr<planner::Plan> plan = planner::PlanMicrobatches(batch, options);
        LOCKSTEP_FUZZ_CHECK(plan.ok(), plan.status().ToString());
        seeds.push_back(planner::Header(batch) + plan->SerializeAsString());
        absl::StatusOr<planner::Plan> split = planner::SplitMicrobatch(*plan, 0);
        if (split.ok()) seeds.push_back(planner::Header(batch) + split->SerializeAsString());
      }
    }
  }
  return seeds;
}

}  // namespace lockstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace planner = lockstep::planner;
  size_t used = 0;
  const std::vector<planner::Sequence> batch = planner::BatchFromHeader(data, size, used);
  if (batch.empty()) return 0;
  planner::Plan plan;
  if (!plan.ParseFromArray(data + used, static_cast<int>(size - used))) return 0;
  const absl::Status verified = planner::VerifyPlan(plan, batch);
  LOCKSTEP_FUZZ_CHECK(verified.ok() || verified.code() == absl::StatusCode::kInvalidArgument,
                      verified.ToString());
  planner::ReadUnverified(plan, batch);
  if (verified.ok()) planner::CheckVerified(plan, batch);
  return 0;
}
