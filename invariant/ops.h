// invariant/ops.h
//
// The kernels of placement-invariant mode (invariant/mode.h): a linear layer, an embedding, layer
// norm, GELU, cross-entropy and causal attention over each sequence's own keys, whose every output
// element is computed by the same operations in the same order whatever else the call holds.
// Differentiable through autograd.
//
// Note [Placement invariance]
// LibTorch's kernels give a row's bits as a function of the whole call: a matrix product picks
// its blocking (and, on a GPU, split-K) from the number of rows; a softmax over a microbatch's
// keys reduces masked and unmasked keys together in an order set by where the sequence sits; an
// elementwise function takes a vectorized path or a scalar one (different bits for exp, erf) by
// the element's offset. So a sequence packed after others, split across microbatches or sharded
// over CP computes other bits than alone. These kernels remove each of those dependences:
//   - Linear(x, w): out[m, n] = sum over k of x[m, k] * w[n, k], accumulated in float64 in
//     increasing k from zero, rounded once to the output dtype. Nothing of row m's sum depends on
//     the other rows. (Products of float32, bfloat16 or float16 values are exact in float64, so
//     the only roundings are the additions', in one fixed order.)
//   - LayerNorm and CrossEntropy: each row's sums in float64 in increasing column from zero (the
//     row sums through Linear's loop), every other step an elementwise float64 operation
//     (correctly rounded whatever the vectorization) or, for exp and log, one scalar path.
//   - Gelu(x): each element through float64 erf, elementwise by one scalar path.
//   - SequenceAttention(q, k, v, query_tokens, key_tokens): each query attends to the keys of its
//     own sequence at positions up to its own, taken in increasing position (not in the order
//     the microbatch holds them; padding and other sequences' keys never enter a reduction), in
//     float64: scores, their maximum, the exponentials' sum and the weighted sum of values, each
//     in that order, rounded once.
// Hence, for a sequence whose keys are present (with CP, gathered from the group), its outputs
// are bit-identical in every placement, on every row count, and equal to a float64 reference
// within one rounding of the output dtype plus the float64 sums' error (tested).
// Gradients: the input gradients are computed the same way (dx by Linear against w's transpose;
// attention's dq per query, dk and dv per key summed over all of its sequence's queries in
// increasing position; with CP, ShardedSequenceAttention gathers the queries in backward so that
// every member sums over all of them, as unsharded would), so they too depend only on the
// sequence. A weight's gradient is a sum over every token of the step: given an ExactGradients
// (WeightGradient), Linear and Embedding add each token's contribution there exactly (Note [Exact
// accumulation] in exact_gradients.h), and the step's gradients are the same bits however its
// tokens were placed; without one, autograd's .grad receives a float sum over the call's rows.
//
// The operator recorder sees none of the kernels' own LibTorch calls (Note [The kernels as one
// call] in ops.cc): under the mode a recording shows the model's LibTorch operators only.
//
// Devices: the CPU and CUDA. A CUDA kernel computes each element by the operations the CPU's
// loop writes, in its order, through explicitly rounded float64 intrinsics (no fused
// multiply-add), so Linear gives the CPU's bits on a GPU; exp and erf are CUDA's, which may
// differ from the C library's in the last bit, so Gelu and attention are invariant on each device
// but may differ between them by a rounding.
// Dtypes: float32, float64, bfloat16, float16 (outputs in the input's dtype).
//
// Thread-safety: as LibTorch's operators.

#ifndef LOCKSTEP_INVARIANT_OPS_H_
#define LOCKSTEP_INVARIANT_OPS_H_

#include <cstdint>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "invariant/exact_gradients.h"

namespace lockstep {
namespace invariant {

// Where a weight's gradient goes: autograd's .grad (no `exact`), or slot `slot` of `exact`.
// Precondition: `exact` outlives the backward of every call given it.
struct WeightGradient {
  // The exact sums; null: autograd's .grad.
  ExactGradients* exact = nullptr;
  // The weight's slot in `exact` (ExactGradients::SlotOf).
  int slot = -1;
};

// x [M, K] times the transpose of w [N, K]: [M, N] (a bias-free torch.nn.functional.linear).
// kInvalidArgument for shapes that do not chain or dtypes that differ.
absl::StatusOr<at::Tensor> Linear(const at::Tensor& x, const at::Tensor& w,
                                  WeightGradient w_gradient = {});

// Rows `ids` (int64 [T]) of weight [V, K]: [T, K], an embedding lookup (bit-exact in any
// placement); its backward adds each token's output gradient to its row, exactly with `exact`.
absl::StatusOr<at::Tensor> Embedding(const at::Tensor& weight, const at::Tensor& ids,
                                     WeightGradient weight_gradient = {});

// torch.nn.functional.layer_norm of each row of x [M, K] with weight and bias [K]: the row's mean,
// then its variance, each a float64 sum in increasing k divided by K; (x - mean) / sqrt(var + eps)
// * weight + bias in float64, rounded once to x's dtype. The backward's weight and bias gradients
// are sums over the call's rows: given exact sums, each token's contribution is added there.
absl::StatusOr<at::Tensor> LayerNorm(const at::Tensor& x, const at::Tensor& weight,
                                     const at::Tensor& bias, double eps = 1e-5,
                                     WeightGradient weight_gradient = {},
                                     WeightGradient bias_gradient = {});

// Each row's cross-entropy (reduction 'none') of logits [M, V] against targets (int64 [M], each
// in [0, V)): the row's log-sum-exp (its maximum plus the log of a float64 sum in increasing v)
// minus its target's logit; [M] in logits' dtype. kInvalidArgument for a target outside [0, V).
absl::StatusOr<at::Tensor> CrossEntropy(const at::Tensor& logits, const at::Tensor& targets);

// The exact (erf) GELU of x, any shape.
absl::StatusOr<at::Tensor> Gelu(const at::Tensor& x);

// Causal attention of queries q [Mq, D] over keys k [Mk, D] and values v [Mk, Dv]: softmax of
// scale * q k^T over the visible keys, times v; [Mq, Dv]. query_tokens [Mq, 2] and key_tokens
// [Mk, 2] (int64, any device) give each row's (sequence id, position); query i sees key j when
// their ids are equal and j's position is at most i's. Keys with a negative id are padding and
// never seen. kInvalidArgument for two keys with one (id, position), or a query that sees no key.
absl::StatusOr<at::Tensor> SequenceAttention(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& query_tokens,
                                             const at::Tensor& key_tokens, double scale);

// SequenceAttention of this member's queries over the keys and values of every member of
// `group` (a CP group: each member holds its own rows of q, k, v, and `tokens` [rows, 2] for
// them). Forward gathers k, v and the tokens, each member's rows padded to `widest`; backward
// gathers q, the output gradient and the tokens, and every member computes every key's gradient
// over all of its sequence's queries, keeping its own rows: the bits unsharded attention gives.
// A null group: SequenceAttention over this member's rows. Collective: every member calls it;
// a member that fails in backward (an exact-gradient refusal) leaves the others in the gather
// until the communicator's timeout, which ends it.
absl::StatusOr<at::Tensor> ShardedSequenceAttention(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, const at::Tensor& tokens,
                                                    double scale, int64_t widest,
                                                    collectives::Communicator* group);

}  // namespace invariant
}  // namespace lockstep

#endif  // LOCKSTEP_INVARIANT_OPS_H_
