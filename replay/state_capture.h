// replay/state_capture.h
//
// A rank's complete training state at a step boundary, captured for the state-replay protocol
// (tools/replay.cc): two runs that should match are compared capture by capture, byte for byte,
// and the first differing step, rank, state path, byte and element are named.
//
// When: after the optimizer's update and before the gradients are zeroed, so that one capture
// holds the step's gradients and the update they made. Capture `step` k is the state after k
// updates.
//
// What (the state paths, in the order they are written and compared — the inputs of the next
// step first, so that a resume that forgot one is named by it, not by the weights it then
// changed):
//   data/position                 int64: the caller's data cursor (batches consumed)
//   ledger/committed_step         int64: the ledger's last committed step (admission/ledger.h)
//   rng/<stream>/cpu              uint8: a CPU generator's state bytes; <stream> is "caller",
//   rng/<stream>/cuda             "model" or "named/<name>"; cuda: int64 [seed, offset];
//   rng/named/<name>/seed         named/<name>/seed: int64 [seed]
//   rng/program/<name>            a generator outside LibTorch's (Python's random, NumPy's
//                                 global state), as the program gives it
//   optimizer/<param>/<field>     numerics::OptimizerState's fields (step, exp_avg, ...), or the
//                                 program's own (an optimizer written in Python)
//   weights/<name>                every parameter and buffer the caller names
//   gradients/<name>              each weight's .grad(), where it has one
// A component the caller cannot give (a program with no ledger, no optimizer) is declared absent
// with a reason (CaptureComponents::absent): an absent component without a reason is refused
// (kInvalidArgument naming it), so nothing is skipped silently. Weights without a gradient are
// listed in the index.
//
// On disk, <root>/step<k>/rank<r>/:
//   state.safetensors   the tensors above, in that order
//   index.json          {"format", "step", "rank", "world_size", "paths": [...], "components":
//                        {"<c>": {"present": true} | {"present": false, "reason": ...}},
//                        "program_rng": {"<name>": {"present": ...}}, "no_gradient": [...],
//                        "context": <execution context record>}
//   complete.json       written last: {"format", "step", "rank", "state_sha256", "index_sha256"}
//                       (plain SHA-256 of each file, as sha256sum prints it)
// Each file is written atomically and durably; a capture without complete.json, or whose files
// do not hash to what it says, is partial (state_replay.h refuses it). An existing capture
// directory is never overwritten (kAlreadyExists).
//
// Note [Saved state and state capture]
// A rank's state is written in two formats, on purpose. trainer/saved_state.h is what a rank
// resumes from: opaque where that is safest (the optimizer as torch::save's archive, which loads
// into any torch optimizer; the RNG streams as one sealed resume state checked against this
// rank's generators), written complete-or-absent and loaded all or nothing. A capture is what two
// runs are compared by: every piece of the same state (and more: gradients, the data position,
// the ledger's step) as a named tensor, element-addressable, so that a difference is named down
// to a state path and a byte. Neither is a subset of the other: a capture cannot be resumed from
// (its optimizer state is per-field tensors, not an archive an optimizer loads), and a saved state
// cannot be compared by path (an archive's bytes are not its fields). The pieces both hold go
// through one code path each: weights through numerics' safetensors, RNG stream states through
// rng::RankStreams.
//
// Thread-safety: as the streams and the optimizer (one thread); the tensors must be still.
//
// Example (a training loop):
//   adam.step();
//   replay::CaptureComponents state;
//   state.weights = named; state.optimizer = &adam; state.streams = streams.get();
//   state.data_position = step + 1;
//   state.absent["ledger"] = "this program keeps no ledger";
//   LOCKSTEP_RETURN_IF_ERROR(replay::WriteStateCapture(dir, step + 1, rank, world, state));

#ifndef LOCKSTEP_REPLAY_STATE_CAPTURE_H_
#define LOCKSTEP_REPLAY_STATE_CAPTURE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "numerics/named_tensors.h"
#include "rng/rank_streams.h"

namespace torch {
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace lockstep {
namespace replay {

// The "format" of a capture's index.json and complete.json; LoadStateCapture refuses any other.
inline constexpr char kStateCaptureFormat[] = "lockstep.state_capture/1";

// The components, in capture order.
inline constexpr const char* kCaptureComponents[] = {"data",      "ledger",  "rng",
                                                     "optimizer", "weights", "gradients"};

// What WriteStateCapture captures of a rank: each component given, or declared absent with a
// reason (see the top of this file).
struct CaptureComponents {
  // Parameters and buffers by name; their gradients are the "gradients" component.
  numerics::NamedTensors weights;
  // The optimizer whose state is the "optimizer" component (numerics::OptimizerState's fields);
  // null: absent (or given as optimizer_state).
  const torch::optim::Optimizer* optimizer = nullptr;
  // The optimizer's state as "<param>/<field>" tensors, for an optimizer that is not a
  // torch::optim::Optimizer (one written in Python): the "optimizer" component, written as
  // "optimizer/<param>/<field>". Refused together with `optimizer`. Default: empty.
  numerics::NamedTensors optimizer_state;
  // Generators outside LibTorch's (Python's random, NumPy's global state), each as a tensor of its
  // state, by name: written as "rng/program/<name>" after the streams. Default: empty.
  numerics::NamedTensors program_rng;
  // name -> why the program has no such generator (the index records it beside those given, so
  // a generator the program does not use is declared, not skipped). Default: empty.
  std::map<std::string, std::string> program_rng_absent;
  // Every stream of the rank: the caller's default generators, the model stream, named streams.
  // Precondition: outside any model-stream scope or named-stream fork.
  const rng::RankStreams* streams = nullptr;
  // The caller's data cursor (batches consumed): the "data" component; nullopt: absent.
  std::optional<int64_t> data_position;
  // The ledger's last committed step (admission/ledger.h): the "ledger" component; nullopt:
  // absent.
  std::optional<int64_t> ledger_step;
  // component name -> why this program does not have it. Required for each component left out;
  // refused for one that is given.
  std::map<std::string, std::string> absent;
};

// The directory of rank `rank`'s capture of step `step` under `root`.
std::string CaptureDirectory(const std::string& root, int64_t step, int rank);

// Writes the capture described above into CaptureDirectory(root, step, rank) (its parents are
// created). kInvalidArgument for a negative step, a rank outside [0, world_size), a component
// absent without a reason or given with one, both optimizer forms, a program generator both given
// and declared absent (or absent without a reason), an optimizer whose state
// numerics::OptimizerState cannot name (kUnimplemented); kAlreadyExists when the capture directory
// exists; I/O errors as base/file_io.h's. On failure no complete.json is left, so the capture reads
// as partial.
absl::Status WriteStateCapture(const std::string& root, int64_t step, int rank, int world_size,
                               const CaptureComponents& components);

}  // namespace replay
}  // namespace lockstep

#endif  // LOCKSTEP_REPLAY_STATE_CAPTURE_H_
