// checkpoint/checkpoint.h
//
// Checkpoint(fn, inputs) is activation checkpointing for LibTorch autograd whose recompute
// replays the forward pass's randomness exactly. (Vocabulary: an "activation checkpoint" is this
// recompute of a block's activations in backward; what a restarted training run continues from
// is its "resume state", see rng/resume_state.h.)
//
// Forward runs `fn` without recording a graph (no activations kept) and saves the values of
// the RNG streams it may draw from (see rng_state_saver.h: by default the CPU generator and the
// CUDA generator of the inputs' device; the rank's named streams through
// StreamSnapshots::Of). The outputs get
// one autograd node. Its backward:
//   1. saves the live stream values,
//   2. rewinds the streams to the forward values and recomputes `fn` with grad,
//   3. restores the live values (also when the recompute throws),
//   4. backpropagates the incoming gradients through the recomputed graph: parameters used by
//      `fn` accumulate their .grad as usual; the inputs' gradients flow on.
// So recomputed dropout masks equal the forward's, gradients are exactly those of the same block
// run without checkpointing, and the live streams (including whatever the caller drew between
// forward and backward, and an active model-stream scope's state) are left as they were.
//
// Lifetime: the saved stream values and the saved inputs belong to the autograd node. They are
// released as soon as backward has run through it (unless backward was asked to retain the
// graph) — also while the outputs are still held — or, without backward, when the last output
// (and with it the graph) is freed.
// A backward through a node whose state was released fails with an error naming the cause.
// RetainedState() counts what is retained, for leak checks.
//
// What `fn` may be: any function of tensors that runs the same operations on recompute (no
// rank- or time-dependent control flow). Non-tensor arguments travel in its captures. Inputs
// may or may not require grad; leaf tensors captured by `fn` (parameters) get their gradients
// either way. Outputs that are views, inputs, captured tensors that require grad, or repeats
// of another output are returned as copies, so that autograd history can be attached to them.
// Checkpoints nest (a checkpointed `fn` may call Checkpoint).
//
// Limits (as with torch.utils.checkpoint's reentrant form): backward through a checkpoint
// accumulates into the .grad of the leaves `fn` uses, also under torch::autograd::grad or
// backward(inputs=...); create_graph=true (higher-order gradients) is refused in backward;
// tensors captured by `fn` that have autograd history of their own (non-leaves) must be passed
// as inputs instead, since the recompute's backward consumes their upstream graph.
// Recomputes hold a process-wide lock while the streams are rewound, so `fn` must not itself
// run a backward that reaches another checkpoint (e.g. a gradient penalty computed inside a
// checkpointed block).
//
// CUDA graphs: inside a capture, forward saves and backward rewinds the graph-safe generator
// position (rng/snapshot.h), so replaying the graph replays the same masks in forward
// and recompute. Where the LibTorch build has no graph-safe generator state, a checkpoint whose
// `fn` runs stochastic CUDA ops inside a capture is refused in forward (kFailedPrecondition),
// while deterministic `fn`s are captured normally. Named streams hold eager (seed, offset)
// states, which cannot be installed during a capture, so inside a capture `fn` draws from the
// default generators only.
//
// Thread-safety: the RNG streams are process-global. Recomputes are serialized process-wide
// (one backward may run checkpoint nodes on several engine threads); the caller must not draw
// from the same streams on other threads while a backward runs.
//
// Example:
//   auto block = [&](const std::vector<at::Tensor>& in) {
//     return std::vector<at::Tensor>{at::dropout(mlp->forward(in[0]), 0.1, /*train=*/true)};
//   };
//   LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> out, checkpoint::Checkpoint(block, {x}));
//   out[0].sum().backward();  // recompute sees the same dropout mask

#ifndef LOCKSTEP_CHECKPOINT_CHECKPOINT_H_
#define LOCKSTEP_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "checkpoint/rng_state_saver.h"

namespace lockstep {
namespace checkpoint {

// The block a checkpoint runs: a function of tensors to tensors that runs the same operations
// when recomputed (see the top of this file).
using CheckpointedFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// How Checkpoint saves and replays randomness. Default: the default generators of the inputs'
// devices.
struct CheckpointOptions {
  // The RNG streams to replay. Null: StreamSnapshots over the CPU generator plus the CUDA
  // generator of the first CUDA input's device, or of the current CUDA device when no input is
  // on CUDA (CPU only in builds or processes without CUDA).
  std::shared_ptr<const RngStateSaver> rng_streams;
};

// Runs `fn(inputs)` as a checkpointed block (see above). Errors: what `fn` throws, converted
// (kInternal, kResourceExhausted for out-of-memory, ...), and the saver's errors. When grad mode
// is off, `fn` simply runs (nothing to recompute) and nothing is saved.
absl::StatusOr<std::vector<at::Tensor>> Checkpoint(const CheckpointedFunction& fn,
                                                   const std::vector<at::Tensor>& inputs,
                                                   const CheckpointOptions& options = {});

// What checkpoints currently retain for their backward: autograd nodes still holding saved
// stream values, and the bytes of those values (from SavedRngState::ByteSize).
struct RetainedCheckpointState {
  int64_t nodes = 0;      // checkpoint nodes whose saved stream values are not yet released
  int64_t rng_bytes = 0;  // bytes of those values, summed over the nodes
};
// What the process's checkpoints retain now (0 and 0 once every checkpoint's backward has run,
// or its outputs were freed). Thread-safe.
RetainedCheckpointState RetainedState();

}  // namespace checkpoint
}  // namespace lockstep

#endif  // LOCKSTEP_CHECKPOINT_CHECKPOINT_H_
