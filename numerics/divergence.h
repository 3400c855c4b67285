// numerics/divergence.h
//
// First-divergence localization: record what every module of a model computes in two runs, then
// name the first module, in execution order, where the runs differ.
//
// LibTorch's C++ modules have no forward hooks, so a model taps itself: around each module's
// call, `x = recorder.Enter("block3", x); y = block3(x); y = recorder.Exit("block3", y);`.
// Forward, Exit records the module's output. Backward, tensor hooks record the gradient arriving
// at that output and the gradient leaving the module through its input (Enter passes the input
// through an identity, so that the gradient is seen before it reaches the previous module).
// Records therefore follow execution order: forward outputs in call order, then for each module
// in backward order the gradient at its output, then at its input. Each record keeps a digest
// (numerics/digest.h) and a summary (sum, mean |x|, min, max, L2 norm); the first
// keep_full_tensors records also keep the tensor itself, so that a divergence there comes with
// the full comparison figures (numerics/compare.h).
//
// A recording is saved as a safetensors file: the records as JSON in the metadata
// ("lockstep.recording"), the kept tensors as "<index>/<module>/<kind>".
//
// Thread-safety: a Recorder may be fed from autograd's threads (its records are locked).
//
// Example:
//   numerics::RecorderOptions options;
//   options.keep_full_tensors = 4;
//   numerics::Recorder recorder(options);
//   ... forward with taps, loss.backward() ...
//   LOCKSTEP_RETURN_IF_ERROR(recorder.Save("run_a.rec"));
//   // Later, with run_b.rec recorded the same way:
//   LOCKSTEP_ASSIGN_OR_RETURN(numerics::Recording a, numerics::Recording::Load("run_a.rec"));
//   LOCKSTEP_ASSIGN_OR_RETURN(numerics::Recording b, numerics::Recording::Load("run_b.rec"));
//   LOCKSTEP_ASSIGN_OR_RETURN(std::optional<numerics::Divergence> first,
//                             numerics::FirstDivergence(a, b));

#ifndef LOCKSTEP_NUMERICS_DIVERGENCE_H_
#define LOCKSTEP_NUMERICS_DIVERGENCE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "c10/core/Event.h"
#include "nlohmann/json_fwd.hpp"
#include "numerics/compare.h"
#include "numerics/digest.h"

namespace lockstep {
namespace numerics {

// What a record holds: a module's forward output, or the gradient at its output or input; for a
// parameter (a leaf), one backward's contribution as it arrives, or its accumulated .grad.
enum class RecordKind {
  kForwardOutput,        // a module's output (Recorder::Exit)
  kGradientAtOutput,     // the gradient arriving at a module's output (Recorder::Exit's hook)
  kGradientAtInput,      // the gradient leaving a module through its input (Recorder::Enter's hook)
  kIncomingGradient,     // one backward's contribution to a parameter (Recorder::TapParameter)
  kAccumulatedGradient,  // a parameter's .grad (Recorder::RecordAccumulated)
};
// "forward_output", "gradient_at_output", "gradient_at_input", "incoming_gradient" or
// "accumulated_gradient" (the JSON's kind, and the last part of a kept tensor's name).
std::string RecordKindName(RecordKind kind);

// Figures of a recorded tensor, computed in float64; all 0 for an empty tensor.
struct RecordSummary {
  double sum = 0;       // the sum of the elements
  double mean_abs = 0;  // the mean of |x|
  double min = 0;       // the smallest element
  double max = 0;       // the largest element
  double l2 = 0;        // the L2 norm
};

// One recorded tensor: where it was taken, its digest and summary, and (the first
// keep_full_tensors records) the tensor itself.
struct Record {
  int64_t index = 0;  // position in execution order
  // The module name given to Enter and Exit, or for a parameter's records the name given to
  // TapParameter and RecordAccumulated.
  std::string module;
  // Which of the module's (or parameter's) tensors it is.
  RecordKind kind = RecordKind::kForwardOutput;
  // The tensor's safetensors dtype name ("F32", "BF16", ...).
  std::string dtype;
  // The tensor's size along each dimension.
  std::vector<int64_t> shape;
  // The tensor's digest (DigestTensor, numerics/digest.h).
  Digest128 digest{};
  // The tensor's sum, mean |x|, min, max and L2 norm.
  RecordSummary summary;
  at::Tensor tensor;  // defined for the first keep_full_tensors records (a copy on the CPU)
};

// What a Recorder keeps besides digests and summaries.
struct RecorderOptions {
  // Keep the full tensors of the first `keep_full_tensors` records. Default: 0 (digests and
  // summaries only).
  int keep_full_tensors = 0;
};

// One run's records, in execution order: a Recorder's Snapshot, or a recording file loaded.
class Recording {
 public:
  // kInvalidArgument (naming the file) for a file that is not a valid recording.
  static absl::StatusOr<Recording> Load(const std::string& path);
  // A recording of `records`, in execution order; each one's index is its position.
  explicit Recording(std::vector<Record> records) : records_(std::move(records)) {}
  // The records, in execution order.
  const std::vector<Record>& records() const { return records_; }
  // Writes the recording to `path` as a safetensors file (see the top of this file): the records
  // as JSON (RecordJson) in its metadata, the kept tensors as "<index>/<module>/<kind>".
  absl::Status Save(const std::string& path) const;

 private:
  std::vector<Record> records_;
};

// A tap on a parameter's incoming gradients (Recorder::TapParameter): removes its hook when
// destroyed, so a parameter that outlives one recording is not recorded into it again. Move-only.
class ParameterTap {
 public:
  // Takes over `other`'s hook; `other` then removes nothing when destroyed.
  ParameterTap(ParameterTap&& other) noexcept;
  // Removes this tap's hook, then takes over `other`'s.
  ParameterTap& operator=(ParameterTap&& other) noexcept;
  ParameterTap(const ParameterTap&) = delete;
  ParameterTap& operator=(const ParameterTap&) = delete;
  ~ParameterTap();

 private:
  friend class Recorder;
  ParameterTap(at::Tensor parameter, unsigned hook)
      : parameter_(std::move(parameter)), hook_(hook) {}
  at::Tensor parameter_;  // undefined once moved from
  unsigned hook_ = 0;
};

// Records one run's module outputs and gradients, fed by the taps a model places around its
// modules (see the top of this file).
class Recorder {
 public:
  // An empty recorder that keeps tensors as `options` says.
  explicit Recorder(RecorderOptions options = RecorderOptions());
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // In forward, before `module` runs: returns `input` through an identity whose gradient is
  // recorded (kGradientAtInput). An input that does not require grad is returned as is.
  at::Tensor Enter(const std::string& module, const at::Tensor& input);
  // In forward, after `module` ran: records `output` (kForwardOutput) and, if it requires grad,
  // the gradient that arrives at it (kGradientAtOutput). Returns `output`.
  at::Tensor Exit(const std::string& module, const at::Tensor& output);

  // Leaf gradients (Note [Leaf gradients] in divergence.cc): each backward's contribution to
  // `parameter` is recorded as it arrives (kIncomingGradient, before it is added to .grad; the
  // uses within one backward already summed by autograd), while the returned tap lives.
  // kInvalidArgument for a tensor that is not a leaf requiring grad.
  absl::StatusOr<ParameterTap> TapParameter(const std::string& name, const at::Tensor& parameter);
  // Records `parameter`'s .grad as it is now (kAccumulatedGradient): call after the backwards.
  // kFailedPrecondition when it has no gradient.
  absl::Status RecordAccumulated(const std::string& name, const at::Tensor& parameter);

  // The first error of a hook (a digest that failed), or OK.
  absl::Status status() const;
  // The records so far, in execution order.
  Recording Snapshot() const;
  // Saves the records so far (Snapshot, then Recording::Save).
  absl::Status Save(const std::string& path) const { return Snapshot().Save(path); }

 private:
  // Note [Deferred record digests] (divergence.cc): a device tensor's record whose digest and
  // summary are still on the device.
  struct Pending {
    size_t index = 0;                   // the record's, in `records`
    at::Tensor hashes;                  // its chunk hashes, enqueued (internal/chunk_hash_device.h)
    at::Tensor figures;                 // its summary's five figures in float64, on its device
    uint64_t num_bytes = 0;             // its logical bytes
    std::unique_ptr<c10::Event> ready;  // recorded after both, on the stream they went to
  };
  struct Shared {
    mutable std::mutex mu;
    std::vector<Record> records;
    std::vector<Pending> pending;
    absl::Status status;
    RecorderOptions options;
  };
  static void Add(Shared& shared, const std::string& module, RecordKind kind,
                  const at::Tensor& tensor);
  // Completes every pending record (one copy back per device). Precondition: shared.mu held.
  static void ResolveLocked(Shared& shared);
  std::shared_ptr<Shared> shared_;  // hooks hold it: they may outlive the recorder
};

// Where two recordings first differ.
struct Divergence {
  // The index of the first record that differs.
  int64_t index = 0;
  // That record's module (`a`'s when both have one).
  std::string module;
  // That record's kind (`a`'s when both have one).
  RecordKind kind = RecordKind::kForwardOutput;
  // Why: "digest", "structure" (module, kind, dtype or shape differ), "length" (one ended).
  std::string reason;
  std::optional<Record> a;  // the record of `a` there (absent past its end)
  std::optional<Record> b;  // the record of `b` there (absent past its end)
  // When both records kept their tensors: the full comparison there.
  std::optional<TensorComparison> comparison;
};

// The first record where `a` and `b` differ, or nullopt when they are identical.
absl::StatusOr<std::optional<Divergence>> FirstDivergence(const Recording& a, const Recording& b,
                                                          const Tolerance& tolerance = Tolerance());

// Where a parameter's gradient first differs between two recordings that tapped it (Note [Leaf
// gradients]): kSame when the accumulated gradients' digests agree; kIncoming when a contribution
// of one run has no equal among the other's (the difference entered before accumulation: in the
// model's backward); kAccumulation when the runs received the same contributions (compared as
// sets of digests, whatever their order) yet accumulated different gradients (the order of the
// additions, or the accumulation itself).
struct GradientLocalization {
  // Where the gradient first differs (see above).
  enum Verdict { kSame, kIncoming, kAccumulation };
  // What LocalizeParameterGradient found for `parameter`.
  Verdict verdict = kSame;
  // The parameter's name in the recordings.
  std::string parameter;
  int64_t incoming_a = 0;  // contributions `a` received (its kIncomingGradient records)
  int64_t incoming_b = 0;  // contributions `b` received
  // kIncoming: the first contribution of `a`, in arrival order, with no equal in `b` (-1: the
  // difference is one in `b` only, at first_unmatched_b).
  int64_t first_unmatched_a = -1;
  // kIncoming: the first contribution of `b`, in arrival order, with no equal in `a` (-1: the
  // difference is one in `a` only). -1 for the other verdicts, as first_unmatched_a.
  int64_t first_unmatched_b = -1;
};
// "same", "incoming" or "accumulation" (the JSON's verdict).
std::string GradientVerdictName(GradientLocalization::Verdict verdict);

// kNotFound when either recording has no accumulated record of `parameter`; kFailedPrecondition
// when the accumulated gradients differ and neither recording tapped its contributions.
absl::StatusOr<GradientLocalization> LocalizeParameterGradient(const Recording& a,
                                                               const Recording& b,
                                                               const std::string& parameter);

// JSON of a record, as a recording file holds it: {index, module, kind (RecordKindName), dtype,
// shape, digest (32 hex digits), summary: {sum, mean_abs, min, max, l2}, kept (whether the tensor
// is kept)}. A non-finite figure is the string "nan", "inf" or "-inf".
nlohmann::json RecordJson(const Record& record);
// {"diverged": false} for nullopt; otherwise {diverged: true, index, module, kind, reason, a, b
// (RecordJson, or null past a recording's end), and comparison (ComparisonJson) when there is
// one}.
nlohmann::json DivergenceJson(const std::optional<Divergence>& divergence);
// {"parameter", "verdict": "same"|"incoming"|"accumulation", "incoming_a", "incoming_b",
//  "first_unmatched_a", "first_unmatched_b"}.
nlohmann::json GradientLocalizationJson(const GradientLocalization& localization);

}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_DIVERGENCE_H_
