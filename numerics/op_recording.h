// numerics/op_recording.h
//
// An operator recording: what an OperatorRecorder (op_recorder.h) wrote for every ATen operator
// call of a step, in execution order, read back for FirstOperatorDivergence (op_divergence.h).
// The file is JSON lines: a header line {"lockstep.operator_recording": 1, "rank": r,
// "row_window": [rows, begin, end] (when one applied)}, then one OperatorRecordJson line per call.
//
// What a digest covers (Note [Operator digests] in op_recording.cc):
//   - a tensor: numerics' tensor digest (digest.h) of its contents, dtype and shape, computed on
//     its device (CPU or CUDA); with a RowWindow (op_recorder.h), of the window's rows along every
//     dimension whose size is the window's row count (a sequence's rows, and its columns of a
//     token-by-token matrix, inside a packed microbatch), of the whole tensor otherwise;
//   - a tensor whose contents are not yet written (the output of aten::empty and its kin, a view
//     of it, and it as an argument written in place, until an operator has written it: Note
//     [Unwritten storage] in op_recorder.cc): dtype and shape only (kind "uninitialized"), so
//     uninitialized memory is not taken for nondeterminism;
//   - an out= argument of the call's schema (written, not read): dtype and shape only;
//   - an undefined tensor, None: their kind; scalars, strings, int and float lists: by value;
//   - anything else (a device, a generator, a dtype): its type name only;
//   - a tensor whose dtype has no safetensors name, or that is not strided on CPU or CUDA: dtype
//     and shape only (kind "opaque").
//
// Thread-safety: an OperatorRecording is immutable once loaded.

#ifndef LOCKSTEP_NUMERICS_OP_RECORDING_H_
#define LOCKSTEP_NUMERICS_OP_RECORDING_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"
#include "numerics/digest.h"

namespace lockstep {
namespace numerics {

// The header line's key; its value is the format version.
inline constexpr char kOperatorRecordingKey[] = "lockstep.operator_recording";
// The format version this build writes and reads (Load refuses another).
inline constexpr int kOperatorRecordingVersion = 1;
// The longest line Load reads: far above any record the recorder writes (a call's values are
// summaries, not data), far below what would exhaust memory when parsed.
inline constexpr size_t kMaxOperatorRecordLine = size_t{16} << 20;

// One input or output of a call. Tensors inside a list are values of their own (same `arg`,
// `item` their position in the list).
struct OperatorValue {
  int arg = 0;    // its position among the call's inputs (arguments) or outputs (returns)
  int item = -1;  // -1: the argument itself, not a list item
  // "tensor", "uninitialized" (contents not yet written), "out" (an out= argument: written, not
  // read), "opaque", "undefined", "none", "scalar", "other".
  std::string kind;
  std::string dtype;           // tensors: the safetensors name (or c10's for an opaque one)
  std::vector<int64_t> shape;  // tensors: the full shape
  // Tensors a RowWindow applied to: the dimensions narrowed to [window_begin, window_end).
  std::vector<int> window_dims;
  int64_t window_begin = -1;  // the window's first row (RowWindow::begin); -1 without a window
  int64_t window_end = -1;    // one past its last row (RowWindow::end); -1 without a window
  std::string value;          // scalars: by value; others: the type name
  double sum = 0;             // output tensors: the sum of the digested elements, in float64
  double max_abs = 0;         // output tensors: max |x| over the digested elements
};

// One operator call: what it was, where it ran, its inputs and outputs and their digests.
struct OperatorRecord {
  int64_t index = 0;  // call order (by start)
  std::string op;     // RecordFunction's name, e.g. "aten::index_add_"
  // The label of the innermost OperatorRecorder::Scope open when the call started.
  std::string module;
  int64_t parent = -1;  // the call this one runs inside, on its thread; -1: none
  // How many calls it runs inside, on its thread (0: a call the program made itself).
  int depth = 0;
  // Its inputs, as they were when the call started.
  std::vector<OperatorValue> inputs;
  // Its outputs, as they were when the call ended.
  std::vector<OperatorValue> outputs;
  // OperatorSideDigest of the inputs.
  Digest128 inputs_digest{};
  // OperatorSideDigest of the outputs.
  Digest128 outputs_digest{};
};

// One rank's operator recording (see the top of this file), in call order.
class OperatorRecording {
 public:
  // kInvalidArgument naming the file and line for a malformed recording (a record out of order,
  // a field of the wrong type, another format version, a line past kMaxOperatorRecordLine) or a
  // file that is not a regular file (a FIFO is refused, never waited on); kNotFound when missing.
  static absl::StatusOr<OperatorRecording> Load(const std::string& path);
  // Whether `path` starts like an operator recording (its header line), without loading it.
  static bool LooksLikeOne(const std::string& path);
  // The recording of rank `rank` holding `records`, in call order; each one's index is its
  // position.
  OperatorRecording(int rank, std::vector<OperatorRecord> records)
      : rank_(rank), records_(std::move(records)) {}
  // The rank named in the header line (0 when it names none).
  int rank() const { return rank_; }
  // The calls, in index order.
  const std::vector<OperatorRecord>& records() const { return records_; }

 private:
  int rank_ = 0;
  std::vector<OperatorRecord> records_;
};

// A value's shape as digested: the window's extent along its window dimensions.
std::vector<int64_t> DigestedShape(const OperatorValue& value);

// One side (inputs or outputs) of a call, digested (Note [Operator digests]): `tensor_digests[i]`
// is the tensor digest of values[i] where its kind is "tensor" (ignored otherwise).
Digest128 OperatorSideDigest(const std::vector<OperatorValue>& values,
                             const std::vector<Digest128>& tensor_digests);

// A call's line of the recording: {index, op, module, parent, depth, inputs, outputs,
// inputs_digest, outputs_digest (32 hex digits each)}. A value is {arg, kind}, with item, dtype,
// shape, window and window_dims, and value where they apply, and an output tensor's sum and
// max_abs (a non-finite one as "nan", "inf" or "-inf").
nlohmann::json OperatorRecordJson(const OperatorRecord& record);
// Appends DumpJson(OperatorRecordJson(record)) to `line`, the same bytes, without building the
// JSON value: the recorder writes one per operator call (Note [Record lines] in op_recording.cc).
void AppendOperatorRecordLine(const OperatorRecord& record, std::string* line);

}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_OP_RECORDING_H_
