// numerics/op_recorder.h
//
// OperatorRecorder taps every ATen operator call through LibTorch's RecordFunction callbacks (one
// global callback, so autograd's backward threads are seen too) while a Scope is open, and writes
// an operator recording (op_recording.h), incrementally: per call, in execution order, its index,
// operator name (aten::mm, lockstep_controls::shuffled_sum, ...), the label of the innermost open
// Scope (the module it ran in), the enclosing call (parent) and nesting depth on its thread, each
// input and output (tensors, tensors inside lists, scalars, None), a digest of its inputs taken
// when the call starts (before an in-place operator mutates them) and one of its outputs when it
// ends, and for each output tensor its sum and max |x|. FirstOperatorDivergence (op_divergence.h)
// compares two recordings.
//
// Cost (Note [Deferred digests] in op_recorder.cc): a call's callback digests its CPU tensors at
// once and, for device tensors, enqueues their digests' chunk hashes and their summaries on the
// device's current stream, in one launch per call into device blocks the recorder keeps (Note
// [Digest arena] in internal/digest_arena.h; a call's read-only inputs with its outputs, Note
// [Read-only inputs after the call]): no copy of a tensor, no allocation, no host synchronization
// (a call that copies a device tensor to the host waits for its stream, so that the copy has
// landed). The hashes and summaries come back at Flush, which runs every flush_every completed
// calls and at Close: device memory grows by about a thousandth of the bytes of up to flush_every
// calls' tensors.
// //numerics:op_recorder_benchmark measures it.
//
// Errors: a callback never throws; its first error is kept and returned by status(), Flush() and
// Close(). Only one OperatorRecorder may exist at a time in a process (its callback is global).
//
// Thread-safety: Scopes are opened and closed by one thread at a time, LIFO; while one is open,
// operator calls are recorded from every thread, in the order they start. Flush, Close and
// status may be called from any thread.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<numerics::OperatorRecorder> recorder,
//                             numerics::OperatorRecorder::Create("ops.rank0.jsonl"));
//   {
//     numerics::OperatorRecorder::Scope step(*recorder, "step");
//     ... forward, loss.backward() ...
//   }
//   LOCKSTEP_RETURN_IF_ERROR(recorder->Close());

#ifndef LOCKSTEP_NUMERICS_OP_RECORDER_H_
#define LOCKSTEP_NUMERICS_OP_RECORDER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "numerics/op_recording.h"

namespace lockstep {
namespace numerics {

// Digest only [begin, end) along every dimension of size `rows` (the whole tensor where none
// has that size): one sequence's rows among the `rows` tokens of a packed microbatch, and its
// columns of a token-by-token matrix (attention scores). Precondition: no other dimension of the
// recorded tensors has size `rows` (choose a token count unlike the model's widths).
struct RowWindow {
  int64_t rows = 0;   // the token count: a dimension of this size is narrowed to the window
  int64_t begin = 0;  // the window's first row (>= 0)
  int64_t end = 0;    // one past its last row; begin < end <= rows
};

// How an OperatorRecorder records: how often it flushes, the row window, and the rank it names.
struct OperatorRecorderOptions {
  // Completed calls between flushes (digests computed, lines written), at least 1. Default: 256.
  int flush_every = 256;
  // See RowWindow. Default: nullopt (whole tensors).
  std::optional<RowWindow> row_window;
  // The rank written in the recording's header line. Default: 0.
  int rank = 0;
};

// Records every ATen operator call made while a Scope is open into an operator recording file
// (see the top of this file). One at a time per process.
class OperatorRecorder {
 public:
  // Starts recording into `path` (a JSON-lines file: a header line, then one line per call).
  // kFailedPrecondition while another OperatorRecorder exists; kInvalidArgument for flush_every
  // < 1 or an empty row window; file errors as the file system reports them.
  static absl::StatusOr<std::unique_ptr<OperatorRecorder>> Create(
      const std::string& path, OperatorRecorderOptions options = OperatorRecorderOptions());
  OperatorRecorder(const OperatorRecorder&) = delete;
  OperatorRecorder& operator=(const OperatorRecorder&) = delete;
  // Removes the callback and writes what is complete; errors are dropped (call Close to see them).
  ~OperatorRecorder();

  // While open, operator calls are recorded under `label` (the innermost open scope's label).
  // Non-copyable, non-movable; scopes nest LIFO.
  class Scope {
   public:
    // Opens a scope of `recorder` labelled `label` (the module of the calls made while it is the
    // innermost); it closes when destroyed. `recorder` must outlive it.
    Scope(OperatorRecorder& recorder, std::string label);
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope();

   private:
    OperatorRecorder& recorder_;
  };

  // Computes the pending digests and writes every completed call. The first error so far.
  absl::Status Flush();
  // Stops recording, flushes and closes the file. kFailedPrecondition when calls that started
  // never ended (a scope closed while another thread ran an operator); the first error so far.
  absl::Status Close();
  // The first error of a callback or flush, or OK.
  absl::Status status() const;
  // Calls recorded so far (started inside a scope).
  int64_t recorded() const;

  struct State;  // implementation (op_recorder.cc)

 private:
  explicit OperatorRecorder(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_OP_RECORDER_H_
