// replay/state_replay.h
//
// Reading and comparing state captures (state_capture.h) for the state-replay protocol
// (tools/replay.cc). Captures are compared as bytes, never as digests: the first difference is
// named by its state path, the byte offset inside that tensor's data and the element index, with
// both elements' values.
//
// Evidence is checked before it is compared: a capture without its completion record, whose
// files do not hash to what the record says, whose index is not this format's, or that disagrees
// with its own directory (step, rank) or its run (world size) is refused (kDataLoss for damaged
// or partial, kNotFound for missing, kInvalidArgument for another format, place or run, or a
// field of the wrong type); two captures whose execution contexts differ in
// a stable field (another build, LibTorch, device, determinism setting: numerics/
// execution_context.h) are incompatible (kFailedPrecondition naming the fields). A caller tells
// such refusals — "the evidence cannot decide" — from a difference in the state, which is a
// value, not an error.
//
// Thread-safety: stateless functions over files.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(replay::RunComparison c,
//                             replay::CompareRuns("ref/captures", "resumed/captures", 3, 6, 4));
//   if (c.first.has_value()) std::cout << c.first->path << " byte " << c.first->byte_offset;

#ifndef LOCKSTEP_REPLAY_STATE_REPLAY_H_
#define LOCKSTEP_REPLAY_STATE_REPLAY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "numerics/safetensors.h"

namespace lockstep {
namespace replay {

// Where a capture must sit and what its run declared (Note [A capture against its place]).
struct CapturePlace {
  int64_t step = 0;    // the step directory it was found under
  int rank = 0;        // the rank directory it was found under
  int world_size = 1;  // the ranks of the run it belongs to
};

// A checked capture: its index's checked fields, its index and its mapped state file.
struct LoadedCapture {
  std::string dir;                  // the capture's directory, as given to LoadStateCapture
  CapturePlace place;               // where it sits, which its index says too
  nlohmann::json context;           // its execution context record (an object)
  std::vector<bool> present;        // per kCaptureComponents entry, whether it was captured
  nlohmann::json index;             // its index.json, parsed
  numerics::SafetensorsFile state;  // its state.safetensors, mapped
};

// Reads and checks the capture in `dir`, which must sit at `place`, as the top of this file
// says: its files are regular files (not links: a run's captures linked to another run's are
// not this run's), its state file's header is checked before its bytes are hashed, and every
// field of its index is read with its type checked. kInvalidArgument for an index that says
// another place, world size or format, or whose fields are missing or of the wrong type.
absl::StatusOr<LoadedCapture> LoadStateCapture(const std::string& dir, const CapturePlace& place);

// Where two captures of one step and rank first differ.
struct CaptureDifference {
  int64_t step = 0;  // the captures' step, as their index says
  int rank = 0;      // the captures' rank, as their index says
  // The state path ("rng/caller/cpu"), in capture order.
  std::string path;
  // "bytes"; "dtype" or "shape" (the tensors' forms differ); "only_in_a"/"only_in_b" (a path one
  // capture has and the other lacks); "components" (a component present in one only).
  std::string kind;
  // For "bytes": the first differing byte inside the tensor's data, the element it belongs to,
  // the count of differing elements, and both elements' values.

  int64_t byte_offset = -1;        // the first differing byte, from the start of the tensor's data
  int64_t element_index = -1;      // the element that byte belongs to (its flat index, 0-based)
  int64_t differing_elements = 0;  // how many of the tensor's elements differ
  int64_t elements = 0;            // the tensor's element count
  std::string a_value,             // capture a's value of that element, printed ("%.9g")
      b_value;                     // capture b's value of that element, printed ("%.9g")
  // Every path that differs in this pair of captures, in capture order.
  std::vector<std::string> differing_paths;
};

// The first difference between two checked captures, or nullopt when every path is byte-equal.
// kFailedPrecondition when their contexts are incompatible.
absl::StatusOr<std::optional<CaptureDifference>> CompareCaptures(const LoadedCapture& a,
                                                                 const LoadedCapture& b);

// What CompareRuns compared, and the first difference it found.
struct RunComparison {
  int64_t first_step = 0;  // the steps compared, [first_step, last_step]
  int64_t last_step = 0;   // the last step compared (see first_step)
  int64_t captures = 0;    // pairs compared
  // The first difference in (step, rank) order; nullopt when all match.
  std::optional<CaptureDifference> first;
};

// Compares the captures of steps [first_step, last_step] of ranks [0, world_size) under two
// capture roots (state_capture.h's layout), in (step, rank) order, stopping at the first step
// that differs (every rank of it compared). Evidence errors as above, naming the capture.
absl::StatusOr<RunComparison> CompareRuns(const std::string& a_root, const std::string& b_root,
                                          int64_t first_step, int64_t last_step, int world_size);

// {"step", "rank", "path", "kind", "byte_offset", "element_index", "differing_elements",
//  "elements", "a", "b", "differing_paths"}.
nlohmann::json CaptureDifferenceJson(const CaptureDifference& difference);

}  // namespace replay
}  // namespace lockstep

#endif  // LOCKSTEP_REPLAY_STATE_REPLAY_H_
