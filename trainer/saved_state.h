// trainer/saved_state.h
//
// A rank's saved state (TrainerRank::SaveState/LoadState, trainer_rank.h): what a restarted rank
// continues from — its weights (safetensors, numerics' format, so `inventory` and `compare` read
// them), its optimizer (torch::save), opt-in its RNG streams (the sealed resume state,
// rng/resume_state.h) and the trainer's forward counter — in one directory.
//
// Contract:
// - Complete or absent, across power loss: the files are written into a sibling temporary
//   directory, each fsynced, the directory fsynced, renamed into place and the parent directory
//   fsynced before SaveTrainingState returns OK. A crash or power loss at any point leaves `dir`
//   absent or complete (a leftover temporary beside it is removed by the next save to `dir`).
// - All or nothing on load: everything is read and checked first — every weight's name, shape
//   and dtype, the optimizer archive (it must load into the optimizer), the RNG resume state
//   (intact, and of this rank's generators), the counter — and only then is anything changed. A
//   refused load leaves the weights, the optimizer and every RNG stream bit-identical to before.
//   A damaged file is kDataLoss naming it; a weight that does not fit is kInvalidArgument naming
//   it; a missing directory or weights file kNotFound.
//
// Why this is not the state-replay capture's format: Note [Saved state and state capture] in
// replay/state_capture.h.
//
// Thread-safety: as the streams' (one thread); the files must not be written concurrently.
//
// Example:
//   LOCKSTEP_RETURN_IF_ERROR(SaveTrainingState("ckpt/step7", *streams, forward_index, weights,
//                                              &adam, SaveOptions()));
//   LOCKSTEP_ASSIGN_OR_RETURN(LoadedState loaded,
//                             LoadTrainingState("ckpt/step7", *streams, weights, &adam));

#ifndef LOCKSTEP_TRAINER_SAVED_STATE_H_
#define LOCKSTEP_TRAINER_SAVED_STATE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "numerics/named_tensors.h"
#include "rng/rank_streams.h"

namespace torch {
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace lockstep {
namespace trainer {

// What SaveState writes besides the weights, the optimizer and the trainer's own counters.
struct SaveOptions {
  // Every RNG stream of the rank (the caller's default generators, the model stream, named
  // streams), so that a restart continues bit-exactly. Off by default: a restart then draws
  // from whatever state the new process has.
  bool include_rng_streams = false;
};

// What a load restored.
struct LoadReport {
  int weights = 0;           // number of tensors of `weights` given their saved values
  bool optimizer = false;    // whether the optimizer's state was loaded (given and saved)
  bool rng_streams = false;  // whether the RNG streams were restored (saved with them)
};

// Removes a directory SaveTrainingState wrote (its files, then the directory), best effort.
void RemoveSavedState(const std::string& dir);

// Writes `weights`, `optimizer` (if given), the RNG streams of `streams` (with
// options.include_rng_streams) and `forward_index` into `dir`, which must not exist
// (kFailedPrecondition). kFailedPrecondition inside a model-stream scope or fork.
absl::Status SaveTrainingState(const std::string& dir, const rng::RankStreams& streams,
                               int64_t forward_index, const numerics::NamedTensors& weights,
                               const torch::optim::Optimizer* optimizer,
                               const SaveOptions& options);

// What LoadTrainingState restored, and the trainer's counter it read.
struct LoadedState {
  LoadReport report;          // what was restored
  int64_t forward_index = 0;  // the saved forward counter (ShardWork::forward_index), >= 0
};

// Reads `dir` and, once all of it checked, copies each saved weight into the tensor of that name
// in `weights` (in place, without recording gradients), loads `optimizer` (if given and saved)
// and restores the RNG streams (if saved). Returns what it restored and the saved forward counter.
absl::StatusOr<LoadedState> LoadTrainingState(const std::string& dir, rng::RankStreams& streams,
                                              numerics::NamedTensors& weights,
                                              torch::optim::Optimizer* optimizer);

}  // namespace trainer
}  // namespace lockstep

#endif  // LOCKSTEP_TRAINER_SAVED_STATE_H_
