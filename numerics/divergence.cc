#include "numerics/divergence.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "ATen/ATen.h"
#include "ATen/core/grad_mode.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "c10/core/impl/VirtualGuardImpl.h"
#include "nlohmann/json.hpp"
#include "numerics/digest.h"
#include "numerics/internal/chunk_hash_device.h"
#include "numerics/safetensors.h"

namespace lockstep {
namespace numerics {
namespace {

using json = nlohmann::json;

constexpr char kRecordingMetadataKey[] = "lockstep.recording";

std::optional<RecordKind> KindFromName(const std::string& name) {
  for (RecordKind kind :
       {RecordKind::kForwardOutput, RecordKind::kGradientAtOutput, RecordKind::kGradientAtInput,
        RecordKind::kIncomingGradient, RecordKind::kAccumulatedGradient}) {
    if (RecordKindName(kind) == name) return kind;
  }
  return std::nullopt;
}

std::string TensorName(const Record& r) {
  return absl::StrCat(r.index, "/", r.module, "/", RecordKindName(r.kind));
}

// One pass over a CPU tensor's elements, accumulating in float64 (the same figures as the device
// path below, without a dispatch per figure: the recorder runs inside every module's forward
// and backward, on tensors that are often small).
template <typename T>
RecordSummary SummarizeCpu(const at::Tensor& contiguous) {
  const T* x = contiguous.data_ptr<T>();
  const int64_t n = contiguous.numel();
  double sum = 0, abs_sum = 0, squares = 0;
  double min = static_cast<double>(x[0]), max = min;
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(x[i]);
    sum += v;
    abs_sum += std::abs(v);
    squares += v * v;
    // NaN propagates as LibTorch's min and max propagate it.
    if (v < min || std::isnan(v)) min = std::isnan(min) ? min : v;
    if (v > max || std::isnan(v)) max = std::isnan(max) ? max : v;
  }
  RecordSummary s;
  s.sum = sum;
  s.mean_abs = abs_sum / static_cast<double>(n);
  s.min = min;
  s.max = max;
  s.l2 = std::sqrt(squares);
  return s;
}

// A device tensor's five figures, reduced in float64 by LibTorch on its device: [sum, mean |x|,
// min, max, L2], not waited for.
at::Tensor DeviceFigures(const at::Tensor& t) {
  const at::Tensor d = t.detach().to(at::kDouble);
  const auto [min, max] = at::aminmax(d);
  return at::stack({d.sum(), d.abs().mean(), min, max, at::linalg_vector_norm(d)});
}

RecordSummary SummaryOf(const double* f) {
  RecordSummary s;
  s.sum = f[0];
  s.mean_abs = f[1];
  s.min = f[2];
  s.max = f[3];
  s.l2 = f[4];
  return s;
}

// The five figures reduced in float64: on the CPU in one pass, elsewhere as DeviceFigures
// brought back at once.
RecordSummary Summarize(const at::Tensor& t) {
  RecordSummary s;
  if (t.numel() == 0) return s;
  if (t.device().is_cpu()) {
    const at::Tensor c = t.detach().contiguous();
    switch (c.scalar_type()) {
      case at::kFloat:
        return SummarizeCpu<float>(c);
      case at::kDouble:
        return SummarizeCpu<double>(c);
      case at::kBFloat16:
        return SummarizeCpu<at::BFloat16>(c);
      case at::kHalf:
        return SummarizeCpu<at::Half>(c);
      default:
        break;
    }
  }
  const at::Tensor figures = DeviceFigures(t).to(at::kCPU);
  return SummaryOf(figures.data_ptr<double>());
}

absl::StatusOr<Record> RecordFromJson(const json& j) {
  Record r;
  if (!j.is_object() || !j.contains("index") || !j["index"].is_number_integer() ||
      !j.contains("module") || !j["module"].is_string() || !j.contains("kind") ||
      !j["kind"].is_string() || !j.contains("dtype") || !j["dtype"].is_string() ||
      !j.contains("shape") || !j["shape"].is_array() || !j.contains("digest") ||
      !j["digest"].is_string() || !j.contains("summary") || !j["summary"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("a record is malformed: ", DumpJson(j)));
  }
  r.index = j["index"].get<int64_t>();
  r.module = j["module"].get<std::string>();
  std::optional<RecordKind> kind = KindFromName(j["kind"].get<std::string>());
  if (!kind)
    return absl::InvalidArgumentError(absl::StrCat("unknown record kind ", DumpJson(j["kind"])));
  r.kind = *kind;
  r.dtype = j["dtype"].get<std::string>();
  for (const json& d : j["shape"]) {
    if (!d.is_number_integer()) return absl::InvalidArgumentError("a record's shape is malformed");
    r.shape.push_back(d.get<int64_t>());
  }
  const std::string hex = j["digest"].get<std::string>();
  const std::string bytes = absl::HexStringToBytes(hex);
  if (hex.size() != 32 || bytes.size() != 16 || absl::BytesToHexString(bytes) != hex) {
    return absl::InvalidArgumentError(
        absl::StrCat("a record's digest '", hex, "' is not 32 hex digits"));
  }
  std::copy(bytes.begin(), bytes.end(), r.digest.begin());
  const json& s = j["summary"];
  for (const char* key : {"sum", "mean_abs", "min", "max", "l2"}) {
    if (!s.contains(key)) return absl::InvalidArgumentError("a record's summary is malformed");
  }
  r.summary = {FigureFromJson(s["sum"]), FigureFromJson(s["mean_abs"]), FigureFromJson(s["min"]),
               FigureFromJson(s["max"]), FigureFromJson(s["l2"])};
  return r;
}

}  // namespace

std::string RecordKindName(RecordKind kind) {
  switch (kind) {
    case RecordKind::kForwardOutput:
      return "forward_output";
    case RecordKind::kGradientAtOutput:
      return "gradient_at_output";
    case RecordKind::kGradientAtInput:
      return "gradient_at_input";
    case RecordKind::kIncomingGradient:
      return "incoming_gradient";
    case RecordKind::kAccumulatedGradient:
      return "accumulated_gradient";
  }
  return "unknown";
}

json RecordJson(const Record& r) {
  return {{"index", r.index},
          {"module", r.module},
          {"kind", RecordKindName(r.kind)},
          {"dtype", r.dtype},
          {"shape", r.shape},
          {"digest", DigestHex128(r.digest)},
          {"summary",
           {{"sum", JsonFigure(r.summary.sum)},
            {"mean_abs", JsonFigure(r.summary.mean_abs)},
            {"min", JsonFigure(r.summary.min)},
            {"max", JsonFigure(r.summary.max)},
            {"l2", JsonFigure(r.summary.l2)}}},
          {"kept", r.tensor.defined()}};
}

Recorder::Recorder(RecorderOptions options) : shared_(std::make_shared<Shared>()) {
  shared_->options = options;
}

// Note [Deferred record digests]
// A record is made inside the model's forward and backward (a module's hook, a gradient's hook).
// Digesting a CUDA tensor there and reading its summary back would wait for the device at every
// record: the host could not run ahead of the device, and a step of many small modules would
// take a host round trip per module. So a CUDA tensor's chunk hashes and its summary's figures
// are only enqueued on its stream, as the operator recorder does (Note [Deferred digests] in
// op_recorder.cc), and completed together when the records are read (Snapshot, status): one
// copy back per device. An event recorded on the stream they went to orders the completion's
// reads after them (a hook may run on another stream than the reader), and the tensor's memory
// is kept from reuse until they have run. A CPU tensor is digested at once. The figures are the
// same LibTorch reductions either way, so a record's values do not depend on when they were
// completed; a completion that fails drops its records, as a digest that fails at once does.
void Recorder::Add(Shared& shared, const std::string& module, RecordKind kind,
                   const at::Tensor& tensor) {
  Record record;
  record.module = module;
  record.kind = kind;
  Pending pending;
  const bool deferred = tensor.defined() && tensor.is_cuda();
  absl::Status status =
      CallTorch(absl::StrCat("recording ", module, " ", RecordKindName(kind)), [&] {
        at::NoGradGuard no_grad;
        const at::Tensor t = tensor.detach();
        record.shape = t.sizes().vec();
        if (!deferred) {
          record.summary = Summarize(t);
        } else if (t.numel() > 0) {
          pending.figures = DeviceFigures(t);
        }
        pending.num_bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
        record.tensor = t;  // dropped below unless kept
      });
  absl::StatusOr<std::string> dtype = SafetensorsDtypeName(tensor.scalar_type());
  if (status.ok() && !dtype.ok()) status = dtype.status();
  if (status.ok()) record.dtype = *dtype;
  absl::StatusOr<Digest128> digest = Digest128{};
  if (!status.ok()) digest = status;
  if (status.ok() && !deferred) digest = DigestTensor(record.tensor);
  if (status.ok() && deferred) {
    absl::StatusOr<at::Tensor> hashes = internal::EnqueueChunkHashes(record.tensor);
    absl::Status enqueued = hashes.status();
    if (hashes.ok()) {
      pending.hashes = *std::move(hashes);
      // The stream they were enqueued on: ResolveLocked reads them on its own streams after this
      // event, and the tensor's memory is not reused before they have run.
      enqueued = CallTorch("ordering a module record's digest", [&] {
        const c10::impl::VirtualGuardImpl guard(c10::DeviceType::CUDA);
        const c10::Stream stream = guard.getStream(record.tensor.device());
        pending.ready = std::make_unique<c10::Event>(c10::DeviceType::CUDA);
        pending.ready->record(stream);
        guard.recordDataPtrOnStream(record.tensor.storage().data_ptr(), stream);
      });
    }
    if (!enqueued.ok()) digest = enqueued;
  }
  std::lock_guard<std::mutex> lock(shared.mu);
  if (!digest.ok()) {
    if (shared.status.ok()) shared.status = digest.status();
    return;
  }
  record.digest = *digest;
  record.index = static_cast<int64_t>(shared.records.size());
  if (record.index < shared.options.keep_full_tensors) {
    record.tensor = record.tensor.to(at::kCPU).clone();
  } else {
    record.tensor = at::Tensor();
  }
  if (deferred) {
    pending.index = shared.records.size();
    shared.pending.push_back(std::move(pending));
  }
  shared.records.push_back(std::move(record));
}

void Recorder::ResolveLocked(Shared& shared) {
  if (shared.pending.empty()) return;
  std::vector<Pending> pending;
  pending.swap(shared.pending);
  std::vector<at::Tensor> hashes;
  // The figures, stacked per device and brought back in one copy each.
  std::map<int, std::vector<size_t>> by_device;
  for (size_t i = 0; i < pending.size(); ++i) {
    hashes.push_back(pending[i].hashes);
    if (pending[i].figures.defined()) {
      by_device[pending[i].figures.device().index()].push_back(i);
    }
  }
  // This thread's streams wait for each record's (a hook may have run on a side stream).
  absl::Status status = CallTorch("ordering the module records' digests", [&] {
    const c10::impl::VirtualGuardImpl guard(c10::DeviceType::CUDA);
    for (const Pending& p : pending) p.ready->block(guard.getStream(p.hashes.device()));
  });
  absl::StatusOr<internal::ChunkHashes> back = internal::ChunkHashes{};
  if (status.ok()) back = internal::CollectChunkHashes(hashes);
  if (status.ok()) status = back.status();
  std::map<size_t, const double*> figures;
  std::vector<at::Tensor> copies;
  if (status.ok()) {
    status = CallTorch("completing the module records' summaries", [&] {
      for (const auto& [device, indices] : by_device) {
        std::vector<at::Tensor> stacked;
        for (size_t i : indices) stacked.push_back(pending[i].figures);
        copies.push_back(at::stack(stacked).to(at::kCPU).contiguous());
        for (size_t k = 0; k < indices.size(); ++k) {
          figures[indices[k]] = copies.back().data_ptr<double>() + 5 * k;
        }
      }
    });
  }
  if (!status.ok()) {
    if (shared.status.ok()) {
      shared.status = Annotate(status, "completing the module records' digests");
    }
    // Their records have no digest: dropped, as a record whose digest failed at once is.
    std::set<size_t> failed;
    for (const Pending& p : pending) failed.insert(p.index);
    std::vector<Record> kept;
    for (size_t i = 0; i < shared.records.size(); ++i) {
      if (failed.count(i) == 0) kept.push_back(std::move(shared.records[i]));
    }
    for (size_t i = 0; i < kept.size(); ++i) kept[i].index = static_cast<int64_t>(i);
    shared.records = std::move(kept);
    return;
  }
  for (size_t i = 0; i < pending.size(); ++i) {
    Record& record = shared.records[pending[i].index];
    record.digest =
        TensorRecordDigest(record.dtype, record.shape, pending[i].num_bytes, back->of_tensor[i]);
    if (auto it = figures.find(i); it != figures.end()) record.summary = SummaryOf(it->second);
  }
}

at::Tensor Recorder::Enter(const std::string& module, const at::Tensor& input) {
  if (!input.defined() || !input.requires_grad()) return input;
  at::Tensor through = input.view_as(input);
  through.register_hook([shared = shared_, module](const at::Tensor& grad) {
    Add(*shared, module, RecordKind::kGradientAtInput, grad);
  });
  return through;
}

at::Tensor Recorder::Exit(const std::string& module, const at::Tensor& output) {
  if (!output.defined()) return output;
  Add(*shared_, module, RecordKind::kForwardOutput, output);
  if (output.requires_grad()) {
    output.register_hook([shared = shared_, module](const at::Tensor& grad) {
      Add(*shared, module, RecordKind::kGradientAtOutput, grad);
    });
  }
  return output;
}

// Note [Leaf gradients]
// A parameter's .grad is the sum of every backward's contribution: with gradient accumulation
// (several microbatches per step, several backwards) the contributions reach the same leaf one
// backward at a time. When two runs' .grad differ, the question is whether a contribution
// differed (the model's backward is not deterministic) or the same contributions were added up
// differently (their order changed: another microbatch order; float addition does not
// associate). A hook on the leaf sees each backward's contribution before AccumulateGrad adds it,
// so the recording holds the contributions in arrival order and then the accumulated .grad;
// LocalizeParameterGradient compares the contributions as a set of digests, so a mere change of
// order is told from a changed contribution. Within one backward, autograd has already summed a
// parameter's uses (a tied embedding, a weight used twice) before the hook sees them: a
// different order of those additions shows as a changed contribution.
absl::StatusOr<ParameterTap> Recorder::TapParameter(const std::string& name,
                                                    const at::Tensor& parameter) {
  if (!parameter.defined() || !parameter.is_leaf() || !parameter.requires_grad()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tapping parameter '", name, "': it must be a leaf tensor that requires grad"));
  }
  unsigned hook = 0;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(absl::StrCat("tapping parameter '", name, "'"), [&] {
    hook = parameter.register_hook([shared = shared_, name](const at::Tensor& grad) {
      Add(*shared, name, RecordKind::kIncomingGradient, grad);
    });
  }));
  return ParameterTap(parameter, hook);
}

absl::Status Recorder::RecordAccumulated(const std::string& name, const at::Tensor& parameter) {
  if (!parameter.defined() || !parameter.grad().defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat("recording the accumulated gradient of '", name, "': it has none"));
  }
  Add(*shared_, name, RecordKind::kAccumulatedGradient, parameter.grad());
  return status();
}

ParameterTap::ParameterTap(ParameterTap&& other) noexcept
    : parameter_(std::move(other.parameter_)), hook_(other.hook_) {
  other.parameter_ = at::Tensor();
}

ParameterTap& ParameterTap::operator=(ParameterTap&& other) noexcept {
  if (this != &other) {
    if (parameter_.defined()) parameter_.remove_hook(hook_);
    parameter_ = std::move(other.parameter_);
    hook_ = other.hook_;
    other.parameter_ = at::Tensor();
  }
  return *this;
}

ParameterTap::~ParameterTap() {
  if (parameter_.defined()) parameter_.remove_hook(hook_);
}

absl::Status Recorder::status() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  ResolveLocked(*shared_);  // Note [Deferred record digests]
  return shared_->status;
}

Recording Recorder::Snapshot() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  ResolveLocked(*shared_);  // Note [Deferred record digests]
  return Recording(shared_->records);
}

absl::Status Recording::Save(const std::string& path) const {
  json records = json::array();
  NamedTensors kept;
  for (const Record& r : records_) {
    records.push_back(RecordJson(r));
    if (r.tensor.defined()) kept.emplace_back(TensorName(r), r.tensor);
  }
  return WriteSafetensors(path, kept, {{kRecordingMetadataKey, DumpJson(records)}});
}

absl::StatusOr<Recording> Recording::Load(const std::string& path) {
  LOCKSTEP_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a lockstep recording: ", why));
  };
  const auto found = file.metadata().find(kRecordingMetadataKey);
  if (found == file.metadata().end()) return invalid("no lockstep.recording metadata");
  absl::StatusOr<json> parsed = ParseJson(found->second, "its lockstep.recording metadata");
  if (!parsed.ok()) return invalid(parsed.status().message());
  const json records = *std::move(parsed);
  if (!records.is_array()) return invalid("its records are not a JSON array");
  std::vector<Record> out;
  for (const json& j : records) {
    absl::StatusOr<Record> r = RecordFromJson(j);
    if (!r.ok()) return invalid(r.status().message());
    if (r->index != static_cast<int64_t>(out.size())) {
      return invalid(absl::StrCat("record ", out.size(), " has index ", r->index));
    }
    bool kept = false;
    if (j.contains("kept")) {
      absl::StatusOr<bool> given = JsonBool(j, "kept", absl::StrCat("record ", r->index));
      if (!given.ok()) return invalid(given.status().message());
      kept = *given;
    }
    if (kept) {
      absl::StatusOr<at::Tensor> tensor = file.Tensor(TensorName(*r));
      if (!tensor.ok()) {
        return Annotate(tensor.status(), absl::StrCat("reading record ", r->index, " of ", path));
      }
      r->tensor = *tensor;
    }
    out.push_back(std::move(*r));
  }
  return Recording(std::move(out));
}

absl::StatusOr<std::optional<Divergence>> FirstDivergence(const Recording& a, const Recording& b,
                                                          const Tolerance& tolerance) {
  const auto& ra = a.records();
  const auto& rb = b.records();
  const size_t n = std::max(ra.size(), rb.size());
  for (size_t i = 0; i < n; ++i) {
    Divergence d;
    d.index = static_cast<int64_t>(i);
    if (i < ra.size()) d.a = ra[i];
    if (i < rb.size()) d.b = rb[i];
    const Record& known = d.a ? *d.a : *d.b;
    d.module = known.module;
    d.kind = known.kind;
    if (!d.a || !d.b) {
      d.reason = "length";
    } else if (d.a->module != d.b->module || d.a->kind != d.b->kind || d.a->dtype != d.b->dtype ||
               d.a->shape != d.b->shape) {
      d.reason = "structure";
    } else if (d.a->digest != d.b->digest) {
      d.reason = "digest";
      if (d.a->tensor.defined() && d.b->tensor.defined()) {
        LOCKSTEP_ASSIGN_OR_RETURN(
            d.comparison, CompareTensors(d.a->tensor, d.b->tensor, tolerance, TensorName(*d.a)));
      }
    } else {
      continue;
    }
    return std::optional<Divergence>(std::move(d));
  }
  return std::optional<Divergence>();
}

std::string GradientVerdictName(GradientLocalization::Verdict verdict) {
  switch (verdict) {
    case GradientLocalization::kSame:
      return "same";
    case GradientLocalization::kIncoming:
      return "incoming";
    case GradientLocalization::kAccumulation:
      return "accumulation";
  }
  return "unknown";
}

absl::StatusOr<GradientLocalization> LocalizeParameterGradient(const Recording& a,
                                                               const Recording& b,
                                                               const std::string& parameter) {
  struct Leaf {
    std::vector<Digest128> incoming;  // arrival order
    std::optional<Digest128> accumulated;
  };
  auto leaf_of = [&](const Recording& r) {
    Leaf leaf;
    for (const Record& record : r.records()) {
      if (record.module != parameter) continue;
      if (record.kind == RecordKind::kIncomingGradient) leaf.incoming.push_back(record.digest);
      if (record.kind == RecordKind::kAccumulatedGradient) leaf.accumulated = record.digest;
    }
    return leaf;
  };
  const Leaf la = leaf_of(a), lb = leaf_of(b);
  if (!la.accumulated || !lb.accumulated) {
    return absl::NotFoundError(absl::StrCat("no accumulated gradient of '", parameter, "' in ",
                                            la.accumulated ? "the second" : "the first",
                                            " recording (Recorder::RecordAccumulated)"));
  }
  GradientLocalization out;
  out.parameter = parameter;
  out.incoming_a = static_cast<int64_t>(la.incoming.size());
  out.incoming_b = static_cast<int64_t>(lb.incoming.size());
  if (*la.accumulated == *lb.accumulated) return out;
  if (la.incoming.empty() && lb.incoming.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the accumulated gradients of '", parameter,
        "' differ, but neither recording holds its incoming contributions (TapParameter during "
        "the backwards): nothing tells where the difference entered"));
  }
  // Each contribution of one run matched with an equal, unused one of the other's.
  auto first_unmatched = [](const std::vector<Digest128>& mine,
                            const std::vector<Digest128>& theirs) -> int64_t {
    std::multiset<Digest128> pool(theirs.begin(), theirs.end());
    for (size_t i = 0; i < mine.size(); ++i) {
      auto found = pool.find(mine[i]);
      if (found == pool.end()) return static_cast<int64_t>(i);
      pool.erase(found);
    }
    return -1;
  };
  out.first_unmatched_a = first_unmatched(la.incoming, lb.incoming);
  out.first_unmatched_b = first_unmatched(lb.incoming, la.incoming);
  out.verdict = out.first_unmatched_a < 0 && out.first_unmatched_b < 0
                    ? GradientLocalization::kAccumulation
                    : GradientLocalization::kIncoming;
  return out;
}

json GradientLocalizationJson(const GradientLocalization& l) {
  return {{"parameter", l.parameter},
          {"verdict", GradientVerdictName(l.verdict)},
          {"incoming_a", l.incoming_a},
          {"incoming_b", l.incoming_b},
          {"first_unmatched_a", l.first_unmatched_a},
          {"first_unmatched_b", l.first_unmatched_b}};
}

json DivergenceJson(const std::optional<Divergence>& divergence) {
  if (!divergence) return {{"diverged", false}};
  const Divergence& d = *divergence;
  json j = {{"diverged", true},
            {"index", d.index},
            {"module", d.module},
            {"kind", RecordKindName(d.kind)},
            {"reason", d.reason},
            {"a", d.a ? RecordJson(*d.a) : json()},
            {"b", d.b ? RecordJson(*d.b) : json()}};
  if (d.comparison) j["comparison"] = ComparisonJson(*d.comparison);
  return j;
}

}  // namespace numerics
}  // namespace lockstep
