// planner/planner.h
//
// Deterministic microbatch plans. PlanMicrobatches turns one DP rank's batch of sequences into
// a Plan (planner/plan.proto): microbatches that each hold at most a token budget, packed
// sequences with their offsets, position ids and cumulative boundaries for variable-length
// attention, each context-parallel (CP) rank's shard, and per-token loss weights under which the
// step's loss equals the loss of the unpacked, unsplit batch. The same input gives the same
// plan bytes on every replica (no hashing, no pointer order, ties broken by input order), which
// the trainer verifies with CheckPlanAgreement (planner/plan_agreement.h).
//
// The caller owns DP partitioning and gradient-accumulation boundaries: a plan covers exactly
// the batch it is given, every token once, and never moves a token across batches.
//
// Packing: first-fit-decreasing by default, computed by bucketing sequences by length (O(n +
// microbatches + longest length), or O(n log n) when the longest sequence is very long compared
// with the batch; see Note [FFD by length buckets] in planner.cc); if filling
// in input order needs strictly fewer microbatches, that packing is used instead, so the default
// never needs more microbatches than in-order filling. PACKING_IN_ORDER keeps input order.
//
// CP sharding (load balance for causal attention; CP_CHUNK_MIRRORED_PAIRS_V1 in plan.proto): each
// packed sequence of n tokens is cut into 2 * cp_size contiguous chunks of n / (2 * cp_size)
// tokens, and rank i owns chunks i and 2 * cp_size - 1 - i (an early, cheap chunk with a late,
// expensive one). The n % (2 * cp_size) leftover tokens lengthen chunks by one token each, in the
// order: rank 0's front chunk, rank 0's back chunk, rank 1's front, rank 1's back, ..., continuing
// across the microbatch's sequences. So a rank gets leftovers in mirrored pairs (the chunk layout
// stays symmetric and causal work proportional to tokens), the ranks take turns, per-rank token
// counts of a microbatch differ by at most 2, and sequences shorter than 2 * cp_size still spread
// over the ranks. A rank can own nothing (e.g. a microbatch with fewer tokens than CP ranks); its
// shard entry is then present, with 0 tokens and 0 pieces.
//
// Compact plans: a shard entry (Microbatch.shard_cp_rank, shard_num_tokens, shard_num_pieces)
// stores its rank, token count and piece count only; the token ranges it owns are derived on
// demand from cu_seqlens by the rule the plan names (Plan.cp_chunk_rule), with ShardPieces /
// ShardTokenIndices. Per packed sequence a microbatch stores its batch index, id and boundary;
// token_begin only where re-planning split a sequence, and loss_scale once per microbatch unless
// the scales differ (TokenBegin and LossScale read both forms). Planning is O(sequences +
// per-token weights + microbatches x cp_size + longest length); the plan holds O(sequences +
// microbatches x cp_size) values.
//
// Loss normalisation: LossScale(microbatch, k) times the caller's per-token weight (1 if none)
// is the token's loss weight; summing weight * per-token loss over every microbatch and shard
// gives the unsplit loss of the chosen normalisation (token mean over the batch by default).
//
// Re-planning: SplitMicrobatch replaces one microbatch by two smaller ones (at a sequence
// boundary; a single sequence at a CP-compatible cut) with every token's loss weight unchanged,
// so that out-of-memory recovery can shrink work without changing the step's loss.
//
// Thread-safety: stateless functions; concurrent calls are safe.
//
// Example:
//   std::vector<planner::Sequence> batch = {planner::Sequence::Of(900, /*id=*/17), ...};
//   const planner::PlanOptions options =
//       planner::PlanOptions::Of(/*max_tokens_per_microbatch=*/65536, /*cp_size=*/2);
//   LOCKSTEP_ASSIGN_OR_RETURN(planner::Plan plan, planner::PlanMicrobatches(batch, options));
//   LOCKSTEP_RETURN_IF_ERROR(planner::CheckPlanAgreement(tp_cp_group, plan));
//   for (int m = 0; m < plan.microbatches_size(); ++m) {
//     LOCKSTEP_ASSIGN_OR_RETURN(std::vector<planner::ShardPiece> mine,
//                               planner::ShardPieces(plan, m, cp_rank));  // packed token ranges
//     ...
//   }

#ifndef LOCKSTEP_PLANNER_PLANNER_H_
#define LOCKSTEP_PLANNER_PLANNER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/sha256.h"
#include "planner/plan.pb.h"

namespace lockstep {
namespace planner {

// One sequence of the DP-local batch.
struct Sequence {
  // A sequence of `num_tokens` tokens with the caller's `id` and per-token `loss_weights`.
  static Sequence Of(int64_t num_tokens, int64_t id, std::vector<float> loss_weights = {}) {
    Sequence sequence;
    sequence.num_tokens = num_tokens;
    sequence.id = id;
    sequence.loss_weights = std::move(loss_weights);
    return sequence;
  }

  // Number of tokens. Must be positive and at most the microbatch budget.
  int64_t num_tokens = 0;
  // The caller's identifier, carried into the plan and named in errors.
  int64_t id = 0;
  // Per-token loss weights (e.g. 0 for prompt tokens). Empty: every token weighs 1. Otherwise
  // num_tokens finite, non-negative values.
  std::vector<float> loss_weights;
};

// The largest context-parallel group a plan may name. A plan stores cp_size shard entries per
// microbatch and ShardPieces costs O(packed sequences x cp_size), so the limit bounds what an
// unverified plan can make a reader allocate or compute; real CP groups are far smaller.
inline constexpr int kMaxCpSize = 1024;

// The most tokens PositionIds, ShardTokenIndices and TokenLossWeights list for one microbatch
// (16 GiB of indices): beyond it they return kResourceExhausted instead of allocating.
inline constexpr int64_t kMaxListedTokens = int64_t{1} << 31;

// How PlanMicrobatches packs a batch: the token budget, the CP group size, the packing policy
// and the loss normalisation.
struct PlanOptions {
  // The options for a budget of `max_tokens_per_microbatch` tokens over `cp_size` CP ranks, with
  // the defaults below for the rest.
  static PlanOptions Of(int64_t max_tokens_per_microbatch, int cp_size = 1) {
    PlanOptions options;
    options.max_tokens_per_microbatch = max_tokens_per_microbatch;
    options.cp_size = cp_size;
    return options;
  }

  // Most tokens a microbatch may hold. Required: positive and at least 2 * cp_size.
  int64_t max_tokens_per_microbatch = 0;
  // Size of the context-parallel group, 1..kMaxCpSize. Default: 1 (no CP).
  int cp_size = 1;
  // Default: first-fit-decreasing (never more microbatches than in-order filling).
  PackingPolicy packing = PACKING_FIRST_FIT_DECREASING;
  // Default: token mean over the whole batch.
  LossNormalization loss_normalization = LOSS_TOKEN_MEAN;
};

// Plans `batch` under `options`. kInvalidArgument, naming the sequence (index and id) and the
// limit, for: a non-positive budget, a CP size outside [1, kMaxCpSize]; a budget under 2 * cp_size
// (a microbatch could not give every CP rank its two chunks); an empty batch; a sequence with no
// tokens, more tokens than the budget, or loss weights of the wrong count, negative or not finite;
// loss weights that sum to 0 where the normalisation divides by that sum (the batch for token mean,
// a sequence for sequence mean). Nothing is dropped or truncated.
absl::StatusOr<Plan> PlanMicrobatches(absl::Span<const Sequence> batch, const PlanOptions& options);

// As above, but plans into `plan`, replacing its contents and reusing its storage: a trainer
// that plans every step can keep one Plan and skip re-allocating (and, where the allocator has
// returned the memory to the system, re-faulting) the plan's arrays each step. On error `plan`
// is left cleared.
absl::Status PlanMicrobatches(absl::Span<const Sequence> batch, const PlanOptions& options,
                              Plan& plan);

// Returns `plan` with microbatch `microbatch` replaced by two microbatches holding its tokens
// (later microbatches move up by one): if it packs two or more sequences, at the sequence
// boundary closest to half its tokens (the earlier one on a tie); if it holds a single sequence
// (or part of one) of n tokens, at the largest multiple of 2 * cp_size not above n / 2, but at
// least 2 * cp_size tokens (the first part is a whole number of 2 * cp_size-token rounds; the
// second holds the rest, possibly fewer tokens than CP ranks). Every token keeps its loss weight;
// a part of a split sequence keeps its position ids (attention to the earlier part is the
// caller's concern). kInvalidArgument for an index out of range; kFailedPrecondition for a
// single sequence of at most 2 * cp_size tokens, which cannot be split further.
absl::StatusOr<Plan> SplitMicrobatch(const Plan& plan, int microbatch);

// The CP chunk rule this library plans and derives shards with.
inline constexpr CpChunkRule kCpChunkRule = CP_CHUNK_MIRRORED_PAIRS_V1;

// The plan's bytes: deterministic protobuf serialization, identical for identical plans.
std::string SerializePlan(const Plan& plan);

// The tag framed before the plan bytes in PlanDigest.
inline constexpr absl::string_view kPlanDigestTag = "lockstep/planner/plan/v2";

// The plan digest replicas compare: Sha256Framed({kPlanDigestTag, SerializePlan(plan)})
// (base/sha256.h), computed by streaming the serialization through the hash in blocks, without
// building the bytes. It covers the per-token loss weights through Plan.loss_weights_digest.
Sha256Digest PlanDigest(const Plan& plan);

// The tag hashed first in LossWeightsDigest.
inline constexpr absl::string_view kLossWeightsDigestTag = "lockstep/planner/loss-weights/v1";

// SHA-256 of the batch's per-token loss weights: after the framed kLossWeightsDigestTag, for
// each sequence that has weights, in batch order, its batch index and weight count (8-byte
// little-endian each) and its weights (IEEE-754 binary32, little-endian, bit for bit). Sequences
// without weights contribute nothing (the plan records their lengths and ids itself), so an
// explicit all-ones vector differs from none, and 0.0 from -0.0. Costs one pass over the weights;
// nothing for a batch without weights. PlanMicrobatches stores it in Plan.loss_weights_digest.
Sha256Digest LossWeightsDigest(absl::Span<const Sequence> batch);

// The first token of the input sequence that packed sequence k of `microbatch` holds:
// token_begin[k], or 0 when token_begin is empty (see plan.proto). Precondition: 0 <= k < number
// of packed sequences.
int64_t TokenBegin(const Microbatch& microbatch, int k);

// The position in its input sequence of packed token `t` (an offset into the microbatch's packed
// buffer) of packed sequence k of `microbatch`. Precondition: cu_seqlens[k] <= t < cu_seqlens[k+1].
inline int64_t PositionInSequence(const Microbatch& microbatch, int k, int64_t t) {
  return TokenBegin(microbatch, k) + (t - microbatch.cu_seqlens(k));
}

// The loss scale of packed sequence k of `microbatch`: loss_scale[k], or the single shared
// loss_scale[0] (see plan.proto). Precondition: 0 <= k < number of packed sequences, and
// loss_scale has 1 or that many entries (VerifyPlan checks both).
double LossScale(const Microbatch& microbatch, int k);

// Position ids of the microbatch's packed tokens, restarting at each sequence (continuing from
// token_begin for the later part of a split sequence). kInvalidArgument for a malformed
// microbatch (per-sequence arrays of other lengths, cu_seqlens not starting at 0 or not strictly
// increasing, num_tokens not its end, a negative token_begin or one whose positions overflow);
// kResourceExhausted for more than kMaxListedTokens tokens.
absl::StatusOr<std::vector<int64_t>> PositionIds(const Microbatch& microbatch);

// One token range a CP rank owns: packed sequence `sequence` of the microbatch, its chunk
// `chunk` in [0, 2 * cp_size), packed-buffer offsets [begin, end), begin < end.
struct ShardPiece {
  int32_t sequence = 0;  // index of the packed sequence in the microbatch
  int32_t chunk = 0;     // the sequence's chunk, in [0, 2 * cp_size)
  int64_t begin = 0;     // first token's offset in the packed buffer
  int64_t end = 0;       // one past the last token's offset
};

// The token ranges `cp_rank` owns of microbatch `microbatch` of `plan`, derived from its
// cu_seqlens by the plan's CP chunk rule, ordered by packed sequence, then chunk (so by offset).
// Empty for a rank that owns nothing; its count and token sum are the shard entry's
// shard_num_pieces and shard_num_tokens in a valid plan. O(packed sequences x cp_size).
// kInvalidArgument, naming the value and the range, for a microbatch or rank out of range, a
// cp_size outside [1, kMaxCpSize] or malformed cu_seqlens (not starting at 0, not strictly
// increasing);
// kFailedPrecondition for a CP chunk rule this library does not know.
absl::StatusOr<std::vector<ShardPiece>> ShardPieces(const Plan& plan, int microbatch, int cp_rank);

// Offsets into the microbatch's packed token buffer of the tokens `cp_rank` owns, in piece order
// (ShardPieces expanded token by token). Empty for a rank that owns nothing. Errors as
// ShardPieces, and kResourceExhausted for a microbatch of more than kMaxListedTokens tokens.
absl::StatusOr<std::vector<int64_t>> ShardTokenIndices(const Plan& plan, int microbatch,
                                                       int cp_rank);

// Loss weight of each packed token of `microbatch` (caller weight times LossScale), in packed
// order. `batch` is the batch the plan was made from; kInvalidArgument if the microbatch is
// malformed (as PositionIds) or does not match it (unknown batch index, different id, tokens
// beyond the sequence, a sequence with loss weights of another count than its tokens);
// kResourceExhausted for more than kMaxListedTokens tokens.
absl::StatusOr<std::vector<double>> TokenLossWeights(const Microbatch& microbatch,
                                                     absl::Span<const Sequence> batch);

// TokenLossWeights written into `out`, which the caller owns (TrainerRank writes a tensor's
// storage, with no vector between). The same refusals, and kInvalidArgument when `out` is not
// exactly num_tokens() long; on any error nothing is written.
absl::Status WriteTokenLossWeights(const Microbatch& microbatch, absl::Span<const Sequence> batch,
                                   absl::Span<double> out);

// tokens / (microbatches x budget): how full the plan's microbatches are, in (0, 1].
double PackingEfficiency(const Plan& plan);

}  // namespace planner
}  // namespace lockstep

#endif  // LOCKSTEP_PLANNER_PLANNER_H_
