// service/service.h (the consumer workspace rooted at consumers/bazel)
//
// A small piece of a training service built on lockstep as an external repository: it plans a
// DP rank's step into microbatches, draws the model's own noise on the model stream (the
// caller's generators untouched), draws numbers every member of a TP x CP group agrees on, and
// runs dropout as an activation-checkpointed block.
//
// Thread-safety: as lockstep's RNG streams (one thread per RankStreams; the default generators
// are process-global).

#ifndef SERVICE_SERVICE_H_
#define SERVICE_SERVICE_H_

#include <cstdint>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "collectives/communicator.h"
#include "planner/planner.h"
#include "rng/rank_streams.h"

namespace service {

// The plan of one step: sequences of `lengths` tokens (ids 0, 1, ...) packed under
// `token_budget` tokens per microbatch over `cp_size` CP ranks (planner::PlanMicrobatches'
// defaults otherwise). Errors: the planner's.
absl::StatusOr<lockstep::planner::Plan> PlanStep(absl::Span<const int64_t> lengths,
                                                 int64_t token_budget, int cp_size = 1);

// `n` uniform numbers drawn on the rank's model stream, on `device` (the CPU, or the CUDA device
// `streams` were created with); the caller's default generators are left exactly as they were.
absl::StatusOr<at::Tensor> ModelNoise(lockstep::rng::RankStreams& streams, int64_t n,
                                      c10::Device device = c10::Device(c10::kCPU));

// Makes `group`'s default RNG state group rank 0's (rng::Synchronize), then draws `n` uniform
// numbers from it: the same numbers on every member. A null group is a group of one.
absl::StatusOr<at::Tensor> SynchronizedDraw(lockstep::collectives::Communicator* group,
                                            const lockstep::rng::RankStreams& streams, int64_t n);

// Dropout of `x` with probability `p` (training mode) as an activation-checkpointed block:
// backward recomputes it with the forward's mask.
absl::StatusOr<at::Tensor> CheckpointedDropout(const at::Tensor& x, double p);

}  // namespace service

#endif  // SERVICE_SERVICE_H_
