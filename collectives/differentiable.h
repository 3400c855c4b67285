// collectives/differentiable.h
//
// Collectives that autograd can differentiate, over a lockstep Communicator, for models split
// over tensor and context parallelism (TP layers, CP attention: the example language model in
// examples/lm and qualify's reference model use them):
//   CopyToGroup       forward: identity;                 backward: all-reduce sum over the group
//                     (before a column-parallel layer: each member's input gradient is partial)
//   ReduceFromGroup   forward: all-reduce sum;           backward: identity
//                     (after a row-parallel layer: the members hold partial sums)
//   GatherRows        forward: all-gather of the members' rows, each padded to `widest` rows;
//                     backward: all-reduce sum of the gradient, then this member's own rows
//                     (every member's gradient holds contributions to every member's rows)
//   ReduceScatterRows forward: all-reduce sum of [size x widest, ...], then this member's own
//                     rows [rank x widest, rank x widest + rows); backward: the all-gather of
//                     every member's row gradients (GatherRows' forward)
//                     (a sequence-parallel layer's output: each member keeps its own rows)
// These are Megatron's f, g and all-gather, written against Communicator so they run over the
// thread fake, Gloo and NCCL alike. A null group (a split of size 1) makes each the identity
// (GatherRows then pads nothing).
//
// Contract: every member calls the same functions in the same order, in forward and (through
// autograd) in backward. A failed collective in forward comes back as a status; in backward it
// is thrown as the LibTorch exception whose type carries its code (base/torch_boundary.h), so the
// caller's CallTorch around backward sees the same status code.
//
// Thread-safety: as the communicator's.

#ifndef LOCKSTEP_COLLECTIVES_DIFFERENTIABLE_H_
#define LOCKSTEP_COLLECTIVES_DIFFERENTIABLE_H_

#include <cstdint>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "collectives/communicator.h"

namespace lockstep {
namespace collectives {

// `x` unchanged; its gradient summed over `group` in backward.
absl::StatusOr<at::Tensor> CopyToGroup(const at::Tensor& x, Communicator* group);

// The sum of `x` over `group`; the gradient passed through unchanged in backward.
absl::StatusOr<at::Tensor> ReduceFromGroup(const at::Tensor& x, Communicator* group);

// [group size x widest, ...]: member r's rows of `x` ([n_r, ...], n_r <= widest) at rows
// [r x widest, r x widest + n_r), zeros after them. kInvalidArgument when x has more than `widest`
// rows or no dimensions.
absl::StatusOr<at::Tensor> GatherRows(const at::Tensor& x, int64_t widest, Communicator* group);

// Member `rank`'s `rows` rows (rows <= widest) of the sum over `group` of `x` ([group size x
// widest, ...], member r's rows at [r x widest, r x widest + n_r)). kInvalidArgument when x does
// not have group size x widest rows or rows > widest.
absl::StatusOr<at::Tensor> ReduceScatterRows(const at::Tensor& x, int64_t rows, int64_t widest,
                                             Communicator* group);

// The example of the header:
//   // [n, width] query rows of this CP rank; keys of every CP rank, padded to the widest shard:
//   LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor keys, GatherRows(k, work.widest_shard, cp_group));
//   // TP: column-parallel in, row-parallel out.
//   LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor in, CopyToGroup(x, tp_group));
//   LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor out, ReduceFromGroup(at::mm(h, w2_shard.t()), tp_group));

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_DIFFERENTIABLE_H_
