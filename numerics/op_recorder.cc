// numerics/op_recorder.cc: the operator recorder (op_recorder.h): its dispatcher callbacks and
// the recording's lifecycle. How a call's values are captured and digested is
// internal/op_capture.cc's.
//
// Note [RecordFunction and NDEBUG]
// LibTorch is built with NDEBUG, this file may not be. Without NDEBUG, RecordFunction::inputs()
// asserts a debug-only flag that the library never sets, so every call's inputs() would throw.
// RecordFunction is parsed here as the library was built; the flag sits in padding, so the
// layout is the same either way. No other file of lockstep calls inputs().
#ifndef NDEBUG
#define NDEBUG
#include "ATen/record_function.h"
#undef NDEBUG
#else
#include "ATen/record_function.h"
#endif

#include "numerics/op_recorder.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "ATen/ATen.h"
#include "ATen/core/dispatch/Dispatcher.h"
#include "ATen/core/function_schema.h"
#include "ATen/core/grad_mode.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "c10/core/impl/DeviceGuardImplInterface.h"
#include "nlohmann/json.hpp"
#include "numerics/digest.h"
#include "numerics/internal/chunk_hash_device.h"
#include "numerics/internal/digest_arena.h"
#include "numerics/internal/op_capture.h"
#include "numerics/internal/summary_partials.h"

namespace lockstep {
namespace numerics {

using json = nlohmann::json;

namespace {

using internal::DeviceDigest;
using internal::Kept;
using internal::LeavesUninitialized;
using internal::MovesStorage;
using internal::Role;
using internal::StorageUse;

// Note [Unwritten storage]
// Memory from a caching allocator holds whatever was there: a digest of it would be taken for
// nondeterminism. The recorder therefore follows, per storage, whether an operator has written it
// since an allocation operator (aten::empty and its kin) made it, and digests only its structure
// (kind "uninitialized") where a call cannot have relied on its contents:
//   - the allocation's output itself;
//   - a view of it (a return the schema marks Tensor(a), aliasing without writing: narrow, slice,
//     as_strided), and it as the argument the view aliases; a view leaves the storage unwritten;
//   - an argument the call writes in place (Tensor(a!): copy_, fill_, index_put_), whose old
//     contents a write-only call ignores.
// Any other call that takes or produces the whole storage makes it data: its later digests
// cover the contents. A part written or read (a narrow view copied into, as a gather into a
// padded buffer does row block by row block) leaves the rest unwritten. A call that reads an
// unwritten storage (not through the cases above) has its contents digested: either the caller
// wrote it outside the operators (through a data pointer), and a difference is real, or the program
// reads uninitialized memory, which is nondeterminism to find. A call that reads and writes an
// unwritten argument in place (add_) is taken for write-only. A Storage that aten::set_ puts
// under a tensor was made outside the operators (c10d's Gloo stages CUDA tensors through fresh
// page-locked storages this way): it is listed as unwritten too, and the tensor set onto it,
// like any output on an unwritten storage of set_, is digested by structure. Entries are weak
// references: a freed storage's address cannot be reused while it is listed.

// A call's schema facts, by argument and return position.
struct SchemaFacts {
  bool known = false;  // the call has a schema (autograd's own records, "detach", do not)
  std::vector<Role> arguments;
  std::vector<Role> returns;
  // By argument: written though the schema does not say so (Note [Undeclared writes]).
  std::vector<bool> undeclared_writes;

  bool WritesUndeclared(int arg) const {
    return arg >= 0 && static_cast<size_t>(arg) < undeclared_writes.size() &&
           undeclared_writes[arg];
  }
  // Whether the call writes `use`'s tensor: by its schema or Note [Undeclared writes].
  bool Writes(const StorageUse& use) const {
    return use.role == Role::kWritten || use.role == Role::kOut || WritesUndeclared(use.arg);
  }
};

// Note [Undeclared writes]
// Some aten:: operators write an argument their schema gives as read-only (Tensor?, not
// Tensor(a!)?): batch normalization's kernels update the running statistics they are passed,
// cuDNN's and MIOpen's RNNs their dropout state and cuDNN's RNN backward its reserve space (an
// input and output of cudnnRNNBackwardData), inside the kernel, with no dispatched call that
// says so. The recorder must digest such an argument before the call (Note [Read-only inputs
// after the call]), and take the call for a writer of it, so that open calls holding it
// (aten::batch_norm around aten::native_batch_norm) digest it first too. Positions are in the
// operators' schemas.
struct UndeclaredWrite {
  const char* op;
  int args[2];  // -1: none
};
constexpr UndeclaredWrite kUndeclaredWrites[] = {
    {"aten::native_batch_norm", {3, 4}},
    {"aten::cudnn_batch_norm", {3, 4}},
    {"aten::miopen_batch_norm", {3, 4}},
    {"aten::batch_norm_update_stats", {1, 2}},
    {"aten::batch_norm_gather_stats", {3, 4}},
    {"aten::batch_norm_gather_stats_with_counts", {3, 4}},
    {"aten::_cudnn_rnn", {15, -1}},
    {"aten::_cudnn_rnn_backward", {20, -1}},
    {"aten::miopen_rnn", {13, -1}},
};

struct Pending {
  OperatorRecord record;
  std::vector<Kept> input_kept;  // parallel to record.inputs
  std::vector<Kept> output_kept;
  std::vector<StorageUse> input_storages;  // of the inputs' tensors
  // Device inputs digested when the call ends (Note [Read-only inputs after the call]).
  std::vector<DeviceDigest> deferred;
  bool known_schema = false;
  std::optional<c10::Device> input_device;  // an input tensor's, other than the CPU
  bool done = false;
};

}  // namespace

struct OperatorRecorder::State {
  OperatorRecorderOptions options;
  std::string path;
  std::atomic<int> scopes_open{0};
  at::CallbackHandle handle = 0;

  mutable std::mutex mu;
  std::ofstream out;
  bool closed = false;
  std::vector<std::string> labels;
  int64_t next_index = 0;
  int64_t completed_unwritten = 0;
  std::map<int64_t, Pending> pending;
  internal::UnwrittenStorages unwritten;  // Note [Unwritten storage]
  internal::DigestArena arena;            // Note [Digest arena]
  std::set<int64_t> deferring;  // open calls with deferred inputs (Note [Read-only inputs ...])
  absl::Status status;

  void KeepError(const absl::Status& s) {
    if (status.ok() && !s.ok()) status = s;
  }
  // Computes the digests of the completed calls, in index order, and writes them.
  // `all`: every completed call, not only those before the first open one. Holds mu.
  absl::Status FlushLocked(bool all);
  // Completes every digest pending in the arena, of open calls too, and empties it. Holds mu.
  absl::Status ResolveArena();
};

namespace {

std::mutex g_mu;                                   // guards g_state's replacement
std::shared_ptr<OperatorRecorder::State> g_state;  // read with std::atomic_load
thread_local bool t_inside = false;                // this thread is in one of our callbacks
thread_local std::vector<int64_t> t_open;          // this thread's open calls (indices)

// Our own ATen calls (copies, digests, summaries) are neither recorded nor re-entered.
class InsideCallback {
 public:
  InsideCallback() : record_function_off_(false) { t_inside = true; }
  ~InsideCallback() { t_inside = false; }

 private:
  at::RecordFunctionGuard record_function_off_;
  at::NoGradGuard no_grad_;
};

struct CallContext : public at::ObserverContext {
  std::shared_ptr<OperatorRecorder::State> state;
  int64_t index = 0;
};

// What the call does with each argument and return, from its schema (cached per overload).
const SchemaFacts& Facts(const at::RecordFunction& fn) {
  static const SchemaFacts kUnknown;
  thread_local std::unordered_map<std::string, SchemaFacts> cache;
  const c10::optional<c10::OperatorName> name = fn.operator_name();
  if (!name) return kUnknown;
  const std::string key = absl::StrCat(name->name, ".", name->overload_name);
  auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  SchemaFacts& facts = cache[key];
  const c10::optional<c10::FunctionSchema> schema = fn.operator_schema();
  if (!schema) return facts;
  facts.known = true;
  for (const c10::Argument& a : schema->arguments()) {
    const bool written = a.alias_info() != nullptr && a.alias_info()->isWrite();
    const bool viewed = a.alias_info() != nullptr && !written;
    facts.arguments.push_back(a.is_out() ? Role::kOut
                              : written  ? Role::kWritten
                              : viewed   ? Role::kViewed
                                         : Role::kRead);
  }
  for (const c10::Argument& r : schema->returns()) {
    const bool view = r.alias_info() != nullptr && !r.alias_info()->isWrite();
    facts.returns.push_back(view ? Role::kViewOutput : Role::kOutput);
  }
  facts.undeclared_writes.assign(facts.arguments.size(), false);
  for (const UndeclaredWrite& w : kUndeclaredWrites) {
    if (name->name != w.op) continue;
    for (int arg : w.args) {
      if (arg >= 0 && static_cast<size_t>(arg) < facts.undeclared_writes.size()) {
        facts.undeclared_writes[arg] = true;
      }
    }
  }
  return facts;
}

// A device an input tensor of the call is on, other than the CPU.
std::optional<c10::Device> DeviceOfInputs(c10::ArrayRef<const c10::IValue> inputs) {
  for (const c10::IValue& v : inputs) {
    if (v.isTensor() && v.toTensor().defined() && !v.toTensor().is_cpu()) {
      return v.toTensor().device();
    }
  }
  return std::nullopt;
}

// A call that takes a device tensor and returns a CPU one may have copied to the host
// asynchronously (copy_ with non_blocking into page-locked memory, as c10d's Gloo does on its own
// stream): its outputs are read only once the device's current stream, the call's, has done so.
void WaitForCopiesToHost(const std::optional<c10::Device>& input_device,
                         const std::vector<c10::IValue>& outputs) {
  if (!input_device) return;
  for (const c10::IValue& v : outputs) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_cpu()) {
      c10::impl::getDeviceGuardImpl(input_device->type())->getStream(*input_device).synchronize();
      return;
    }
  }
}

// Note [Read-only inputs after the call]
// A device input is digested as it is before the call. Where the call cannot change it, its bytes
// after the call are the same, so its digest is enqueued with the outputs' when the call ends:
// one launch for the call's tensors instead of two (Note [Digest arena]). That holds for an input
// the schema says the call only reads (not Tensor(a!), not an out= argument), whose storage no
// written argument of the call shares, of an aten:: operator (whose schemas declare their
// writes; a custom operator's may not; those that do not are Note [Undeclared writes]). A call
// nested inside it may still write it (a composite operator updating a buffer through an in-place
// call): a call that writes a storage, or one without a schema, first enqueues the deferred
// digests of the open calls' inputs it may write. Each digest is enqueued on the stream that was
// current when its tensor was captured, whichever thread enqueues it.
bool AfterTheCall(const DeviceDigest& d, const SchemaFacts& facts, absl::string_view op,
                  const std::vector<StorageUse>& storages) {
  if (!facts.known || d.role != Role::kRead || facts.WritesUndeclared(d.arg) ||
      !absl::StartsWith(op, "aten::")) {
    return false;
  }
  for (const StorageUse& use : storages) {
    if (facts.Writes(use) && use.storage == d.storage) return false;
  }
  return true;
}

// Enqueues the digests of `digests` into the arena, each into its Kept (parallel); an output whose
// dtype the arena does not summarize gets ATen's figures. Throws std::runtime_error on failure.
void EnqueueDigests(internal::DigestArena& arena, const std::vector<const DeviceDigest*>& digests,
                    const std::vector<Kept*>& kept) {
  if (digests.empty()) return;
  std::vector<internal::DigestArena::Job> jobs;
  jobs.reserve(digests.size());
  for (const DeviceDigest* d : digests) jobs.push_back({d->view, d->summarize, d->stream});
  absl::StatusOr<std::vector<internal::DigestArena::Pending>> pending = arena.Enqueue(jobs);
  if (!pending.ok()) throw std::runtime_error(pending.status().ToString());
  for (size_t i = 0; i < digests.size(); ++i) {
    kept[i]->in_arena = true;
    kept[i]->pending = (*pending)[i];
    if (digests[i]->summarize && !kept[i]->pending.summarized) {
      kept[i]->summary = internal::SummaryPartialOf(digests[i]->view);
    }
  }
}

// Appends `digests` (of values in `kept`) to a batch for EnqueueDigests: `now`, with their Kept in
// `into`.
void AddToBatch(const std::vector<DeviceDigest>& digests, std::vector<Kept>& kept,
                std::vector<const DeviceDigest*>& now, std::vector<Kept*>& into) {
  for (const DeviceDigest& d : digests) {
    now.push_back(&d);
    into.push_back(&kept[d.kept]);
  }
}

// Before a call (of `facts`) that writes some of `storages` (every storage: `all`), enqueues the
// deferred digests of the open calls' inputs on them (Note [Read-only inputs after the call]).
// Holds mu.
void EnqueueDeferredWritten(OperatorRecorder::State& state, const SchemaFacts& facts,
                            const std::vector<StorageUse>& storages, bool all) {
  for (int64_t index : state.deferring) {
    Pending& open = state.pending.at(index);
    std::vector<DeviceDigest> keep;  // moving one leaves the others `now` points to in place
    std::vector<const DeviceDigest*> now;
    std::vector<Kept*> into;
    for (DeviceDigest& d : open.deferred) {
      bool written = all;
      for (const StorageUse& use : storages) {
        written = written || (facts.Writes(use) && use.storage == d.storage);
      }
      if (written) {
        now.push_back(&d);
        into.push_back(&open.input_kept[d.kept]);
      } else {
        keep.push_back(std::move(d));
      }
    }
    EnqueueDigests(state.arena, now, into);
    open.deferred = std::move(keep);
  }
  for (auto it = state.deferring.begin(); it != state.deferring.end();) {
    it = state.pending.at(*it).deferred.empty() ? state.deferring.erase(it) : std::next(it);
  }
}

std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& fn) {
  if (t_inside) return nullptr;
  std::shared_ptr<OperatorRecorder::State> state = std::atomic_load(&g_state);
  if (state == nullptr || state->scopes_open.load(std::memory_order_acquire) == 0) return nullptr;
  InsideCallback inside;
  auto context = std::make_unique<CallContext>();
  context->state = state;
  std::lock_guard<std::mutex> lock(state->mu);
  if (state->closed || state->labels.empty()) return nullptr;
  Pending p;
  p.record.op = fn.name();
  try {
    const SchemaFacts& facts = Facts(fn);
    p.known_schema = facts.known;
    p.input_device = DeviceOfInputs(fn.inputs());
    if (MovesStorage(p.record.op)) {  // Note [Unwritten storage]
      for (const c10::IValue& v : fn.inputs()) {
        if (!v.isStorage()) continue;
        const c10::Storage storage = v.toStorage();
        state->unwritten.insert_or_assign(storage.unsafeGetStorageImpl(),
                                          storage.getWeakStorageImpl());
      }
    }
    std::vector<DeviceDigest> device;
    internal::CaptureAll(fn.inputs(), /*is_output=*/false, facts.arguments, p.record.op,
                         state->options.row_window, state->unwritten, &p.record.inputs,
                         &p.input_kept, &p.input_storages, &device);
    // Note [Read-only inputs after the call]
    const bool writes =
        !facts.known || std::any_of(p.input_storages.begin(), p.input_storages.end(),
                                    [&facts](const StorageUse& use) { return facts.Writes(use); });
    if (writes && !state->deferring.empty()) {
      EnqueueDeferredWritten(*state, facts, p.input_storages, /*all=*/!facts.known);
    }
    std::vector<const DeviceDigest*> now;
    std::vector<Kept*> into;
    for (const DeviceDigest& d : device) {
      if (AfterTheCall(d, facts, p.record.op, p.input_storages)) {
        p.deferred.push_back(d);
      } else {
        now.push_back(&d);
        into.push_back(&p.input_kept[d.kept]);
      }
    }
    EnqueueDigests(state->arena, now, into);
  } catch (const std::exception& e) {
    state->KeepError(
        absl::InternalError(absl::StrCat("recording the inputs of ", p.record.op, ": ", e.what())));
    return nullptr;
  }
  p.record.index = state->next_index++;
  p.record.module = state->labels.back();
  p.record.parent = t_open.empty() ? -1 : t_open.back();
  p.record.depth = static_cast<int>(t_open.size());
  context->index = p.record.index;
  if (!p.deferred.empty()) state->deferring.insert(p.record.index);
  state->pending.emplace(p.record.index, std::move(p));
  t_open.push_back(context->index);
  return context;
}

void OnEnd(const at::RecordFunction& fn, at::ObserverContext* raw) {
  if (raw == nullptr || t_inside) return;
  auto* context = static_cast<CallContext*>(raw);
  OperatorRecorder::State& state = *context->state;
  InsideCallback inside;
  if (!t_open.empty() && t_open.back() == context->index) t_open.pop_back();
  std::lock_guard<std::mutex> lock(state.mu);
  auto found = state.pending.find(context->index);
  if (found == state.pending.end()) return;  // dropped by Close
  Pending& p = found->second;
  std::vector<StorageUse> output_storages;
  try {
    const std::vector<c10::IValue>& outputs = fn.outputs();
    WaitForCopiesToHost(p.input_device, outputs);
    std::vector<DeviceDigest> device;
    internal::CaptureAll(c10::ArrayRef<const c10::IValue>(outputs.data(), outputs.size()),
                         /*is_output=*/true, Facts(fn).returns, p.record.op,
                         state.options.row_window, state.unwritten, &p.record.outputs,
                         &p.output_kept, &output_storages, &device);
    // The call's read-only inputs and its outputs, in one launch (Note [Digest arena]).
    std::vector<const DeviceDigest*> now;
    std::vector<Kept*> into;
    AddToBatch(p.deferred, p.input_kept, now, into);
    AddToBatch(device, p.output_kept, now, into);
    EnqueueDigests(state.arena, now, into);
    p.deferred.clear();
  } catch (const std::exception& e) {
    state.KeepError(absl::InternalError(
        absl::StrCat("recording the outputs of ", p.record.op, ": ", e.what())));
  }
  // The outputs failed: the inputs are still recorded as they were.
  if (!p.deferred.empty()) {
    try {
      std::vector<const DeviceDigest*> now;
      std::vector<Kept*> into;
      AddToBatch(p.deferred, p.input_kept, now, into);
      EnqueueDigests(state.arena, now, into);
    } catch (const std::exception& e) {
      state.KeepError(absl::InternalError(
          absl::StrCat("recording the inputs of ", p.record.op, ": ", e.what())));
    }
  }
  // Note [Unwritten storage]: what a call other than a view or an allocation took or produced
  // is data from now on.
  // A call without a schema says nothing of what it reads or writes.
  if (p.known_schema && !LeavesUninitialized(p.record.op) && !MovesStorage(p.record.op)) {
    for (const std::vector<StorageUse>* uses : {&p.input_storages, &output_storages}) {
      for (const StorageUse& use : *uses) {
        if (use.whole && use.role != Role::kViewed && use.role != Role::kViewOutput) {
          state.unwritten.erase(use.storage);
        }
      }
    }
  }
  p.deferred.clear();
  state.deferring.erase(context->index);
  p.done = true;
  if (++state.completed_unwritten >= state.options.flush_every) {
    state.KeepError(state.FlushLocked(/*all=*/false));
  }
}

}  // namespace

// Note [Deferred digests]
// A callback runs inside every operator call of the step, on the thread that makes it. Digesting
// a device tensor to the end there would cost a host synchronization per call (its chunk hashes
// must come back), and keeping a copy to digest later would cost the tensor's bytes written and
// read again. A callback therefore enqueues the chunk hashes of the tensor as it is at that point
// of its device's stream (the inputs before the call can change them, the outputs after it;
// Note [Read-only inputs after the call]), and an output's summary partials over the same bytes,
// into the recorder's arena (Note [Digest arena]): no allocation, no host synchronization. A CPU
// tensor is digested at once. FlushLocked brings every pending result back, one copy per arena
// block, and completes the digests of the open calls' inputs too, so that the arena empties.
absl::Status OperatorRecorder::State::FlushLocked(bool all) {
  // The completed calls to write now: in index order, up to the first still open (or all).
  std::vector<Pending*> ready;
  for (auto it = pending.begin(); it != pending.end(); ++it) {
    if (!it->second.done) {
      if (!all) break;
      continue;
    }
    ready.push_back(&it->second);
  }
  if (ready.empty()) return absl::OkStatus();
  for (auto it = unwritten.begin(); it != unwritten.end();) {
    it = it->second.expired() ? unwritten.erase(it) : std::next(it);
  }
  LOCKSTEP_RETURN_IF_ERROR(ResolveArena());
  // The summaries ATen computed (dtypes the arena's kernel does not read), brought back together.
  std::vector<Kept*> summarized;
  std::vector<at::Tensor> device_bytes;
  for (Pending* p : ready) {
    for (Kept& kept : p->output_kept) {
      if (kept.summary.defined()) {
        summarized.push_back(&kept);
        device_bytes.push_back(kept.summary);
      }
    }
  }
  if (!device_bytes.empty()) {
    absl::StatusOr<internal::ChunkHashes> back = internal::CollectChunkHashes(device_bytes);
    if (!back.ok()) return Annotate(back.status(), "summarizing the operator calls' outputs");
    for (size_t i = 0; i < summarized.size(); ++i) {
      Kept& kept = *summarized[i];
      kept.figures = internal::FinishSummaryPartials(back->of_tensor[i]);
      kept.summary = at::Tensor();
    }
  }
  std::string lines;
  for (Pending* p : ready) {
    OperatorRecord& r = p->record;
    std::vector<Digest128> side(r.inputs.size());
    for (size_t i = 0; i < r.inputs.size(); ++i) {
      if (p->input_kept[i].digested) side[i] = p->input_kept[i].digest;
    }
    r.inputs_digest = OperatorSideDigest(r.inputs, side);
    side.assign(r.outputs.size(), Digest128{});
    for (size_t i = 0; i < r.outputs.size(); ++i) {
      const Kept& kept = p->output_kept[i];
      if (kept.digested) side[i] = kept.digest;
      if (!kept.figures) continue;
      r.outputs[i].sum = kept.figures->first;
      r.outputs[i].max_abs = kept.figures->second;
    }
    r.outputs_digest = OperatorSideDigest(r.outputs, side);
    AppendOperatorRecordLine(r, &lines);  // Note [Record lines]
    lines.push_back('\n');
  }
  out.write(lines.data(), static_cast<std::streamsize>(lines.size()));
  out.flush();
  if (!out) {
    return absl::InternalError(
        absl::StrCat("writing the operator recording '", path, "': ", std::strerror(errno)));
  }
  for (Pending* p : ready) {
    completed_unwritten -= 1;
    pending.erase(p->record.index);
  }
  return absl::OkStatus();
}

absl::Status OperatorRecorder::State::ResolveArena() {
  std::vector<Kept*> in_arena;
  for (auto& [index, p] : pending) {
    for (std::vector<Kept>* side : {&p.input_kept, &p.output_kept}) {
      for (Kept& kept : *side) {
        if (kept.in_arena) in_arena.push_back(&kept);
      }
    }
  }
  if (in_arena.empty()) return absl::OkStatus();
  LOCKSTEP_RETURN_IF_ERROR(Annotate(arena.Collect(), "digesting the operator calls' tensors"));
  for (Kept* kept : in_arena) {
    kept->digest = TensorRecordDigest(kept->dtype, kept->shape, kept->num_bytes,
                                      arena.Read(kept->pending.hashes));
    if (kept->pending.summarized) {
      kept->figures = internal::FinishSummaryPartials(arena.Read(kept->pending.summary));
    }
    kept->in_arena = false;
  }
  arena.Reset();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<OperatorRecorder>> OperatorRecorder::Create(
    const std::string& path, OperatorRecorderOptions options) {
  if (options.flush_every < 1) {
    return absl::InvalidArgumentError(absl::StrCat("operator recorder: flush_every is ",
                                                   options.flush_every, "; it must be at least 1"));
  }
  if (const auto& w = options.row_window;
      w && (w->begin < 0 || w->end <= w->begin || w->end > w->rows)) {
    return absl::InvalidArgumentError(absl::StrCat("operator recorder: row window [", w->begin,
                                                   ", ", w->end, ") of ", w->rows,
                                                   " rows is empty or out of range"));
  }
  std::lock_guard<std::mutex> global(g_mu);
  if (std::atomic_load(&g_state) != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("operator recorder for '", path, "': another one is recording (",
                     std::atomic_load(&g_state)->path, "); one at a time per process"));
  }
  auto state = std::make_shared<State>();
  state->options = options;
  state->path = path;
  state->out.open(path, std::ios::out | std::ios::trunc);
  if (!state->out) {
    return absl::ErrnoToStatus(errno, absl::StrCat("opening the operator recording '", path, "'"));
  }
  json header = {{kOperatorRecordingKey, kOperatorRecordingVersion}, {"rank", options.rank}};
  if (options.row_window) {
    header["row_window"] = {options.row_window->rows, options.row_window->begin,
                            options.row_window->end};
  }
  state->out << DumpJson(header) << "\n";
  state->out.flush();
  if (!state->out) {
    return absl::ErrnoToStatus(errno, absl::StrCat("writing the operator recording '", path, "'"));
  }
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("adding the operator recorder's callback", [&] {
    state->handle = at::addGlobalCallback(at::RecordFunctionCallback(OnStart, OnEnd)
                                              .needsInputs(true)
                                              .needsOutputs(true)
                                              .scopes({at::RecordScope::FUNCTION}));
  }));
  std::atomic_store(&g_state, state);
  return std::unique_ptr<OperatorRecorder>(new OperatorRecorder(std::move(state)));
}

OperatorRecorder::~OperatorRecorder() { Close().IgnoreError(); }

OperatorRecorder::Scope::Scope(OperatorRecorder& recorder, std::string label)
    : recorder_(recorder) {
  std::lock_guard<std::mutex> lock(recorder_.state_->mu);
  recorder_.state_->labels.push_back(std::move(label));
  recorder_.state_->scopes_open.fetch_add(1, std::memory_order_release);
}

OperatorRecorder::Scope::~Scope() {
  std::lock_guard<std::mutex> lock(recorder_.state_->mu);
  if (!recorder_.state_->labels.empty()) recorder_.state_->labels.pop_back();
  recorder_.state_->scopes_open.fetch_sub(1, std::memory_order_release);
}

absl::Status OperatorRecorder::Flush() {
  InsideCallback inside;  // the flush's own ATen calls are not recorded
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->closed) state_->KeepError(state_->FlushLocked(/*all=*/false));
  return state_->status;
}

absl::Status OperatorRecorder::Close() {
  {
    std::lock_guard<std::mutex> global(g_mu);
    if (std::atomic_load(&g_state) == state_) {
      at::removeCallback(state_->handle);
      std::atomic_store(&g_state, std::shared_ptr<State>());
    }
  }
  InsideCallback inside;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->closed) return state_->status;
  state_->KeepError(state_->FlushLocked(/*all=*/true));
  if (!state_->pending.empty()) {
    state_->KeepError(absl::FailedPreconditionError(
        absl::StrCat("operator recording '", state_->path, "': ", state_->pending.size(),
                     " calls started inside a scope never ended (first: ",
                     state_->pending.begin()->second.record.op, ", call ",
                     state_->pending.begin()->first, ")")));
    state_->pending.clear();
  }
  state_->out.close();
  if (state_->out.fail()) {
    state_->KeepError(
        absl::InternalError(absl::StrCat("closing the operator recording '", state_->path, "'")));
  }
  state_->closed = true;
  return state_->status;
}

absl::Status OperatorRecorder::status() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->status;
}

int64_t OperatorRecorder::recorded() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->next_index;
}

}  // namespace numerics
}  // namespace lockstep
