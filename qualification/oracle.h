// qualification/oracle.h
//
// The trainer's oracle: a training program (ReferenceModel through TrainerRank, a head
// registered with RegisterCustomObject, a caller-drawn random token mask, two accumulated
// forwards per Adam step — the first through the microbatch stream, the second through
// DpRankForward — and two Adam steps) run split over the rank's DP x TP x CP topology and, in the
// same process, unsplit (TP 1 x CP 1) from the state of the rank's TP x CP leader over the same
// DP-local batches. The split run checkpoints every block of the model (ShardWork::RunBlock:
// recomputed in backward, collectives and dropout included); the reference runs them plainly.
// The caller's inputs are token ids it draws. Each rank then checks:
//   replica_outputs     every TP/CP replica received each CP rank's rows bit-identical to what that
//                       CP rank computed (and TP replicas computed the same rows)
//   caller_draws        right after every hand-back the replicas' caller states are bit-identical
//                       and their token masks agree, although between hand-backs the leader draws
//                       more than the others (as a leader that logs a sample does); DP workers'
//                       caller states stay distinct
//   stream_progression  model work never moved the caller's generator (the leader's state right
//                       after each hand-back equals its state before the call), and the model
//                       stream advanced between microbatches
//   reference_match     outputs, caller masks (bit for bit), gradients of every parameter
//                       (summed over CP and DP; the rank's TP shard) and the parameters after two
//                       Adam steps equal the unsplit reference's under the default numerics
//                       tolerance: CP attention, TP layers and the recompute of checkpointed
//                       blocks reproduce the unsplit model
//   resume              a restart from the state saved after step 0 (weights, Adam state, every
//                       RNG stream — the caller's, the model stream and the named stream the
//                       model draws from — through TrainerRank::SaveState/LoadState) gives step
//                       1's outputs and the final parameters bit for bit
//   empty_cp_shard      (CP > 1) a microbatch with fewer tokens than CP ranks ran, with a rank
//                       owning nothing, and still matched
// Collective over the world; every rank must call it with the same topology and options.
//
// Negative controls make a check fail: kNoSync, kNoSyncAfterMicrobatch and
// kNoSyncAfterAllMicrobatches (the caller not synchronized at all, or on one forward path only:
// caller_draws), kUnscopedModelWork (no model-stream scope: stream_progression),
// kInputInsideScope (the caller materialises its inputs on the model stream: reference_match),
// kResumeWithoutNamedStreams (the restart leaves the named streams fresh: resume).

#ifndef LOCKSTEP_QUALIFICATION_ORACLE_H_
#define LOCKSTEP_QUALIFICATION_ORACLE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "c10/core/Device.h"
#include "collectives/communicator.h"
#include "collectives/topology.h"
#include "qualification/negative_controls.h"

namespace lockstep {
namespace qualification {

struct OracleCheck {
  std::string name;
  bool passed = false;
  std::string detail;
};

// With `device` a CUDA device (--config=cuda builds), every tensor of the program — model,
// inputs, masks, outputs, gradients — lives there and the ranks' CUDA generators are part of their
// streams; the communicator must move CUDA tensors (Gloo does, through the host; NCCL natively).
absl::StatusOr<std::vector<OracleCheck>> RunTrainerOracle(
    collectives::Communicator& world, const collectives::Topology& topology,
    NegativeControl control, c10::Device device = c10::Device(c10::kCPU));

// RunTrainerOracle on a DP x TP x CP topology of `world`, folded into one status: OK when every
// check passed, kFailedPrecondition listing "name: detail" of each failed check, or the error that
// stopped the oracle. With `print`, rank 0 prints each check's line (and flushes, as process
// worlds end without flushing stdio).
absl::Status RunTrainerOracleVerdict(collectives::Communicator& world, int dp, int tp, int cp,
                                     NegativeControl control, c10::Device device, bool print);

}  // namespace qualification
}  // namespace lockstep

#endif  // LOCKSTEP_QUALIFICATION_ORACLE_H_
