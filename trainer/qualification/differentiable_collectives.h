// trainer/qualification/differentiable_collectives.h
//
// Collectives that autograd can differentiate, over a lockstep Communicator, for models split
// over tensor and context parallelism (the reference model's TP layers and CP attention):
//   CopyToGroup       forward: identity;                 backward: all-reduce sum over the group
//                     (before a column-parallel layer: each member's input gradient is partial)
//   ReduceFromGroup   forward: all-reduce sum;           backward: identity
//                     (after a row-parallel layer: the members hold partial sums)
//   GatherRows        forward: all-gather of the members' rows, each padded to `widest` rows;
//                     backward: all-reduce sum of the gradient, then this member's own rows
//                     (every member's gradient holds contributions to every member's rows)
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

#ifndef LOCKSTEP_TRAINER_QUALIFICATION_DIFFERENTIABLE_COLLECTIVES_H_
#define LOCKSTEP_TRAINER_QUALIFICATION_DIFFERENTIABLE_COLLECTIVES_H_

#include <cstdint>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "collectives/communicator.h"

namespace lockstep {
namespace trainer {

// `x` unchanged; its gradient summed over `group` in backward.
absl::StatusOr<at::Tensor> CopyToGroup(const at::Tensor& x, collectives::Communicator* group);

// The sum of `x` over `group`; the gradient passed through unchanged in backward.
absl::StatusOr<at::Tensor> ReduceFromGroup(const at::Tensor& x, collectives::Communicator* group);

// [group size x widest, ...]: member r's rows of `x` ([n_r, ...], n_r <= widest) at rows
// [r x widest, r x widest + n_r), zeros after them. kInvalidArgument when x has more than `widest`
// rows or no dimensions.
absl::StatusOr<at::Tensor> GatherRows(const at::Tensor& x, int64_t widest,
                                      collectives::Communicator* group);

}  // namespace trainer
}  // namespace lockstep

#endif  // LOCKSTEP_TRAINER_QUALIFICATION_DIFFERENTIABLE_COLLECTIVES_H_
