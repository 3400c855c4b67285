// numerics/internal/op_capture.h  (private to numerics/: the operator recorder's)
//
// How the operator recorder (op_recorder.h) captures one operator call's values: each value's
// kind and text, and for a tensor its digest (Note [Deferred digests] in op_recorder.cc: of a
// device tensor only enqueued) and an output's summary, following which storages are still
// unwritten (Note [Unwritten storage] in op_recorder.cc). op_recorder.cc keeps the dispatcher
// callbacks and the recording's lifecycle.
//
// Thread-safety: the caller serializes calls that share an UnwrittenStorages (the recorder holds
// its mutex).

#ifndef LOCKSTEP_NUMERICS_INTERNAL_OP_CAPTURE_H_
#define LOCKSTEP_NUMERICS_INTERNAL_OP_CAPTURE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/string_view.h"
#include "numerics/digest.h"
#include "numerics/internal/digest_arena.h"
#include "numerics/op_recorder.h"
#include "numerics/op_recording.h"

namespace lockstep {
namespace numerics {
namespace internal {

// A tensor value's digest as captured (Note [Deferred digests] in op_recorder.cc): of a CPU tensor
// computed at once; of a device tensor its chunk hashes enqueued in the recorder's arena (Note
// [Digest arena]), the digest completed at the flush. An output also keeps its summary: sum and
// max |x| in double.
struct Kept {
  bool digested = false;  // the value is a tensor whose contents are digested
  Digest128 digest;
  bool in_arena = false;  // a device tensor's results are pending in the arena, at `pending`
  DigestArena::Pending pending;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t num_bytes = 0;
  // A device output's summary through ATen, as one pending partial, where the arena does not
  // summarize its dtype (float8, ...).
  at::Tensor summary;
  std::optional<std::pair<double, double>> figures;  // an output's sum and max |x|, once known
};

// What a call does with a tensor value, from its schema (Note [Unwritten storage]).
enum class Role {
  kRead,        // an input the call reads
  kViewed,      // an input a returned view aliases (Tensor(a)): not read by a view
  kWritten,     // an input the call writes in place (Tensor(a!)), out= arguments aside
  kOut,         // an out= argument
  kOutput,      // an output
  kViewOutput,  // an output aliasing an input without writing it (Tensor(a)): a view
};

// A tensor's storage as a call used it (Note [Unwritten storage]).
struct StorageUse {
  const void* storage = nullptr;
  Role role = Role::kRead;
  bool whole = false;  // the tensor covers every byte of its storage
  int arg = -1;        // the argument (or return) it came from
};

// A device tensor captured, its digest not enqueued yet: the recorder enqueues a call's together
// (Note [Digest arena] in digest_arena.h).
struct DeviceDigest {
  at::Tensor view;  // what is digested
  bool summarize = false;
  size_t kept = 0;  // its Kept's index in the vector CaptureAll appended to
  Role role = Role::kRead;
  const void* storage = nullptr;
  int arg = -1;  // the argument (or return) it came from
  // Its device's current stream when it was captured, where the call's kernels run: its digest
  // is enqueued there, whichever thread enqueues it.
  c10::Stream stream = c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::kCPU));
};

// Note [Unwritten storage]: storages no operator has written since they were allocated, held
// weakly so that a freed one's address is not taken by another storage while it is listed.
using UnwrittenStorages =
    std::unordered_map<const void*, c10::weak_intrusive_ptr<c10::StorageImpl>>;

// Operators whose output's contents are not written yet (Note [Unwritten storage]).
bool LeavesUninitialized(absl::string_view op);

// aten::set_ neither reads nor writes contents: it moves a tensor onto a storage.
bool MovesStorage(absl::string_view op);

// Captures `values`, an operator call's inputs or (`is_output`) outputs, appending each value
// (each item of a list) to `out` and what it keeps to `kept`, and the storages of its tensors to
// `storages`. `roles[i]`: what the call does with value i (kRead, or kOutput for outputs, past
// the end). `op` is the operator's name; `window` the recorder's row window. An allocation's
// output is added to `unwritten`. A CPU tensor is digested at once; a device tensor is appended
// to `device`, for the caller to enqueue. Throws whatever ATen throws.
void CaptureAll(c10::ArrayRef<const c10::IValue> values, bool is_output,
                const std::vector<Role>& roles, absl::string_view op,
                const std::optional<RowWindow>& window, UnwrittenStorages& unwritten,
                std::vector<OperatorValue>* out, std::vector<Kept>* kept,
                std::vector<StorageUse>* storages, std::vector<DeviceDigest>* device);

// A device output's figures through ATen ([sum, max |x|] as one summary partial on its device),
// for a dtype the arena's summary kernel does not read.
at::Tensor SummaryPartialOf(const at::Tensor& t);

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_INTERNAL_OP_CAPTURE_H_
