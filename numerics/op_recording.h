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

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"
#include "numerics/digest.h"

namespace lockstep {
namespace numerics {

inline constexpr char kOperatorRecordingKey[] = "lockstep.operator_recording";
inline constexpr int kOperatorRecordingVersion = 1;

// One input or output of a call. Tensors inside a list are values of their own (same `arg`,
// `item` their position in the list).
struct OperatorValue {
  int arg = 0;
  int item = -1;  // -1: the argument itself, not a list item
  // "tensor", "uninitialized" (contents not yet written), "out" (an out= argument: written, not
  // read), "opaque", "undefined", "none", "scalar", "other".
  std::string kind;
  std::string dtype;           // tensors: the safetensors name (or c10's for an opaque one)
  std::vector<int64_t> shape;  // tensors: the full shape
  // Tensors a RowWindow applied to: the dimensions narrowed to [window_begin, window_end).
  std::vector<int> window_dims;
  int64_t window_begin = -1;
  int64_t window_end = -1;
  std::string value;  // scalars: by value; others: the type name
  double sum = 0;     // output tensors: over the digested elements
  double max_abs = 0;
};

struct OperatorRecord {
  int64_t index = 0;  // call order (by start)
  std::string op;     // RecordFunction's name, e.g. "aten::index_add_"
  std::string module;
  int64_t parent = -1;  // the call this one runs inside, on its thread; -1: none
  int depth = 0;
  std::vector<OperatorValue> inputs;
  std::vector<OperatorValue> outputs;
  Digest128 inputs_digest{};
  Digest128 outputs_digest{};
};

class OperatorRecording {
 public:
  // kInvalidArgument naming the file and line for a malformed recording (a record out of order,
  // a field of the wrong type, another format version); kNotFound when missing.
  static absl::StatusOr<OperatorRecording> Load(const std::string& path);
  // Whether `path` starts like an operator recording (its header line), without loading it.
  static bool LooksLikeOne(const std::string& path);
  OperatorRecording(int rank, std::vector<OperatorRecord> records)
      : rank_(rank), records_(std::move(records)) {}
  int rank() const { return rank_; }
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

nlohmann::json OperatorRecordJson(const OperatorRecord& record);

}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_OP_RECORDING_H_
