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
//   numerics::Recorder recorder(numerics::RecorderOptions().set_keep_full_tensors(4));
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
#include "nlohmann/json_fwd.hpp"
#include "numerics/compare.h"
#include "numerics/digest.h"

namespace lockstep {
namespace numerics {

// What a record holds: a module's forward output, or the gradient at its output or input; for a
// parameter (a leaf), one backward's contribution as it arrives, or its accumulated .grad.
enum class RecordKind {
  kForwardOutput,
  kGradientAtOutput,
  kGradientAtInput,
  kIncomingGradient,
  kAccumulatedGradient,
};
std::string RecordKindName(RecordKind kind);

struct RecordSummary {
  double sum = 0;
  double mean_abs = 0;
  double min = 0;
  double max = 0;
  double l2 = 0;
};

struct Record {
  int64_t index = 0;  // position in execution order
  std::string module;
  RecordKind kind = RecordKind::kForwardOutput;
  std::string dtype;
  std::vector<int64_t> shape;
  Digest128 digest{};
  RecordSummary summary;
  at::Tensor tensor;  // defined for the first keep_full_tensors records
};

class RecorderOptions {
 public:
  RecorderOptions() = default;
  // Keep the full tensors of the first `n` records (default 0: digests and summaries only).
  RecorderOptions& set_keep_full_tensors(int n) {
    keep_full_tensors_ = n;
    return *this;
  }
  int keep_full_tensors() const { return keep_full_tensors_; }

 private:
  int keep_full_tensors_ = 0;
};

class Recording {
 public:
  // kInvalidArgument (naming the file) for a file that is not a valid recording.
  static absl::StatusOr<Recording> Load(const std::string& path);
  explicit Recording(std::vector<Record> records) : records_(std::move(records)) {}
  const std::vector<Record>& records() const { return records_; }
  absl::Status Save(const std::string& path) const;

 private:
  std::vector<Record> records_;
};

// A tap on a parameter's incoming gradients (Recorder::TapParameter): removes its hook when
// destroyed, so a parameter that outlives one recording is not recorded into it again. Move-only.
class ParameterTap {
 public:
  ParameterTap(ParameterTap&& other) noexcept;
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

class Recorder {
 public:
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
  absl::Status Save(const std::string& path) const { return Snapshot().Save(path); }

 private:
  struct Shared {
    mutable std::mutex mu;
    std::vector<Record> records;
    absl::Status status;
    RecorderOptions options;
  };
  static void Add(Shared& shared, const std::string& module, RecordKind kind,
                  const at::Tensor& tensor);
  std::shared_ptr<Shared> shared_;  // hooks hold it: they may outlive the recorder
};

// Where two recordings first differ.
struct Divergence {
  int64_t index = 0;
  std::string module;
  RecordKind kind = RecordKind::kForwardOutput;
  // Why: "digest", "structure" (module, kind, dtype or shape differ), "length" (one ended).
  std::string reason;
  std::optional<Record> a;  // the records there (absent past a recording's end)
  std::optional<Record> b;
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
  enum Verdict { kSame, kIncoming, kAccumulation };
  Verdict verdict = kSame;
  std::string parameter;
  int64_t incoming_a = 0;  // contributions each run received
  int64_t incoming_b = 0;
  // kIncoming: the first contribution of `a`, in arrival order, with no equal in `b` (-1: the
  // difference is one in `b` only, at first_unmatched_b).
  int64_t first_unmatched_a = -1;
  int64_t first_unmatched_b = -1;
};
std::string GradientVerdictName(GradientLocalization::Verdict verdict);

// kNotFound when either recording has no accumulated record of `parameter`; kFailedPrecondition
// when the accumulated gradients differ and neither recording tapped its contributions.
absl::StatusOr<GradientLocalization> LocalizeParameterGradient(const Recording& a,
                                                               const Recording& b,
                                                               const std::string& parameter);

nlohmann::json RecordJson(const Record& record);
nlohmann::json DivergenceJson(const std::optional<Divergence>& divergence);
// {"parameter", "verdict": "same"|"incoming"|"accumulation", "incoming_a", "incoming_b",
//  "first_unmatched_a", "first_unmatched_b"}.
nlohmann::json GradientLocalizationJson(const GradientLocalization& localization);

}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_DIVERGENCE_H_
