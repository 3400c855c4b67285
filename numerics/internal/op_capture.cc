// numerics/internal/op_capture.cc: an operator call's values as the recorder captures them
// (op_capture.h).

#include "numerics/internal/op_capture.h"

#include <cmath>
#include <stdexcept>
#include <utility>

#include "ATen/Dispatch.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "c10/core/impl/DeviceGuardImplInterface.h"
#include "numerics/safetensors.h"

namespace lockstep {
namespace numerics {
namespace internal {

bool LeavesUninitialized(absl::string_view op) {
  return op == "aten::empty" || op == "aten::empty_like" || op == "aten::empty_strided" ||
         op == "aten::new_empty" || op == "aten::new_empty_strided" || op == "aten::resize_" ||
         op == "aten::resize_as_";
}

bool MovesStorage(absl::string_view op) { return op == "aten::set_"; }

namespace {

// A value as captured.
struct Captured {
  OperatorValue value;
  Kept kept;
};

const void* StorageKey(const at::Tensor& t) {
  return t.defined() && t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
}

bool Unwritten(const UnwrittenStorages& unwritten, const void* storage) {
  auto it = unwritten.find(storage);
  return it != unwritten.end() && !it->second.expired();
}

std::string ScalarText(const c10::IValue& v) {
  if (v.isDouble()) return absl::StrFormat("%.17g", v.toDouble());
  if (v.isInt()) return absl::StrCat(v.toInt());
  if (v.isBool()) return v.toBool() ? "true" : "false";
  if (v.isString()) return v.toStringRef();
  if (v.isIntList()) return absl::StrCat("[", absl::StrJoin(v.toIntVector(), ","), "]");
  if (v.isDoubleList()) {
    std::vector<std::string> parts;
    for (double d : v.toDoubleVector()) parts.push_back(absl::StrFormat("%.17g", d));
    return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
  }
  if (v.isBoolList()) {
    std::vector<std::string> parts;
    for (bool b : v.toBoolList()) parts.push_back(b ? "true" : "false");
    return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
  }
  return "";
}

bool IsScalarLike(const c10::IValue& v) {
  return v.isDouble() || v.isInt() || v.isBool() || v.isString() || v.isIntList() ||
         v.isDoubleList() || v.isBoolList();
}

// An output's figures through ATen, [sum, max |x|] in double on its device: the sum in double is
// what tells two nearly equal outputs apart; max |x| is read once from the tensor where its dtype
// has an infinity norm (not float8's). A CUDA tensor's come from the summary kernel instead (one
// read of its bytes, no converted copy), but for a dtype that kernel does not read.
at::Tensor Summary(const at::Tensor& t) {
  const at::TensorOptions doubles = t.options().dtype(at::kDouble);
  if (t.numel() == 0) return at::zeros({2}, doubles);
  const at::Tensor d = t.to(at::kDouble);
  const at::ScalarType type = t.scalar_type();
  const bool has_norm =
      type == at::kDouble || type == at::kFloat || type == at::kHalf || type == at::kBFloat16;
  const at::Tensor max_abs =
      has_norm ? at::linalg_vector_norm(t, INFINITY).to(at::kDouble) : d.abs().max();
  return at::stack({d.sum(), max_abs});
}

// [sum, max |x|] of the contiguous CPU tensor `t` in one pass over its elements, as the summary
// kernel computes them (each element converted to double, summed in order; a NaN makes max |x|
// NaN): a callback runs in every operator call, and the ATen route costs several dispatched calls
// and converted copies per output. Dtypes it does not read (float8, ...) take Summary's.
std::pair<double, double> HostSummary(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kDouble:
    case at::kFloat:
    case at::kHalf:
    case at::kBFloat16:
    case at::kLong:
    case at::kInt:
    case at::kShort:
    case at::kChar:
    case at::kByte:
    case at::kBool:
      break;
    default: {
      const at::Tensor f = Summary(t);
      const auto a = f.accessor<double, 1>();
      return {a[0], a[1]};
    }
  }
  std::pair<double, double> figures{0.0, 0.0};
  AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, t.scalar_type(),
                             "lockstep_host_summary", [&] {
                               const scalar_t* x = t.data_ptr<scalar_t>();
                               const int64_t n = t.numel();
                               double sum = 0;
                               double max_abs = 0;
                               for (int64_t i = 0; i < n; ++i) {
                                 const double v = static_cast<double>(x[i]);
                                 sum += v;
                                 const double a = std::fabs(v);
                                 if (std::isnan(a) || std::isnan(max_abs)) {
                                   max_abs = std::nan("");
                                 } else if (a > max_abs) {
                                   max_abs = a;
                                 }
                               }
                               figures = {sum, max_abs};
                             });
  return figures;
}

// The kind and text of `v`, which is not a tensor: none, a scalar (or a list of them), or other.
void CaptureNonTensor(const c10::IValue& v, OperatorValue& value) {
  if (v.isNone()) {
    value.kind = "none";
  } else if (IsScalarLike(v)) {
    value.kind = "scalar";
    value.value = ScalarText(v);
  } else {
    value.kind = "other";
    value.value = v.tagKind();
  }
}

// Whether only the structure of tensor `t` (on `storage`, in role `role` of a call of `op`) is
// recorded, as kind "uninitialized" (Note [Unwritten storage]); an allocation's output is listed
// in `unwritten` here.
bool LeftUninitialized(const at::Tensor& t, const void* storage, Role role, absl::string_view op,
                       UnwrittenStorages& unwritten) {
  if (role == Role::kOutput && LeavesUninitialized(op)) {
    if (storage != nullptr) unwritten.insert_or_assign(storage, t.storage().getWeakStorageImpl());
    return true;
  }
  return (role == Role::kViewOutput || role == Role::kViewed || role == Role::kWritten ||
          (role == Role::kOutput && MovesStorage(op))) &&
         Unwritten(unwritten, storage);
}

// `t` narrowed to `window` along every dimension of its size, noted in `value`. Without a window,
// `t` itself (the callback's ATen calls run without autograd: no detached alias is needed).
at::Tensor Windowed(const at::Tensor& t, const std::optional<RowWindow>& window,
                    OperatorValue& value) {
  at::Tensor view = t;
  if (window) {
    for (int64_t dim = 0; dim < view.dim(); ++dim) {
      if (view.size(dim) != window->rows) continue;
      view = view.narrow(dim, window->begin, window->end - window->begin);
      value.window_dims.push_back(static_cast<int>(dim));
      value.window_begin = window->begin;
      value.window_end = window->end;
    }
  }
  return view;
}

// Digests `view` (of safetensors dtype `dtype`) into `kept`: a CPU tensor's digest and, when
// `summarize`, its figures at once; a CUDA tensor is appended to `device` as the `index`th kept
// value, for the caller to enqueue.
void DigestInto(const at::Tensor& view, const std::string& dtype, bool summarize, size_t index,
                Role role, const void* storage, int arg, Kept& kept,
                std::vector<DeviceDigest>* device) {
  kept.digested = true;
  kept.dtype = dtype;
  kept.shape = view.sizes().vec();
  kept.num_bytes = static_cast<uint64_t>(view.numel()) * view.element_size();
  if (summarize && view.numel() == 0) {
    kept.figures = std::make_pair(0.0, 0.0);  // no device round trip for nothing
    summarize = false;
  }
  if (view.is_cuda()) {
    const c10::Stream stream =
        c10::impl::getDeviceGuardImpl(view.device().type())->getStream(view.device());
    device->push_back(DeviceDigest{view, summarize, index, role, storage, arg, stream});
    return;
  }
  const at::Tensor bytes = view.contiguous();
  kept.digest = TensorBytesDigest(
      kept.dtype, kept.shape,
      absl::string_view(static_cast<const char*>(bytes.data_ptr()), kept.num_bytes));
  if (summarize) kept.figures = HostSummary(bytes);
}

// The value of `v` (argument `arg`, list item `item` or -1) and, for a tensor, its digest
// (pending on a device); its storage is added to `storages` (when not null).
// `index`: where its Kept will be among the values captured.
Captured Capture(const c10::IValue& v, int arg, int item, size_t index, Role role,
                 absl::string_view op, const std::optional<RowWindow>& window,
                 UnwrittenStorages& unwritten, std::vector<StorageUse>* storages,
                 std::vector<DeviceDigest>* device) {
  Captured c;
  c.value.arg = arg;
  c.value.item = item;
  if (!v.isTensor()) {
    CaptureNonTensor(v, c.value);
    return c;
  }
  const at::Tensor& t = v.toTensor();
  if (!t.defined()) {
    c.value.kind = "undefined";
    return c;
  }
  c.value.shape = t.sizes().vec();
  absl::StatusOr<std::string> dtype = SafetensorsDtypeName(t.scalar_type());
  if (!dtype.ok() || t.layout() != at::kStrided || !(t.is_cpu() || t.is_cuda())) {
    c.value.kind = "opaque";
    c.value.dtype = std::string(c10::toString(t.scalar_type()));
    return c;
  }
  c.value.dtype = *dtype;
  const void* storage = StorageKey(t);
  if (storages != nullptr && storage != nullptr) {
    const bool whole = t.storage_offset() == 0 && t.is_contiguous() &&
                       t.numel() * static_cast<int64_t>(t.itemsize()) ==
                           static_cast<int64_t>(t.storage().nbytes());
    storages->push_back({storage, role, whole, arg});
  }
  if (role == Role::kOut) {
    c.value.kind = "out";
    return c;
  }
  if (LeftUninitialized(t, storage, role, op, unwritten)) {
    c.value.kind = "uninitialized";
    return c;
  }
  c.value.kind = "tensor";
  const at::Tensor view = Windowed(t, window, c.value);
  DigestInto(view, *dtype, /*summarize=*/role == Role::kOutput || role == Role::kViewOutput, index,
             role, storage, arg, c.kept, device);
  return c;
}

}  // namespace

void CaptureAll(c10::ArrayRef<const c10::IValue> values, bool is_output,
                const std::vector<Role>& roles, absl::string_view op,
                const std::optional<RowWindow>& window, UnwrittenStorages& unwritten,
                std::vector<OperatorValue>* out, std::vector<Kept>* kept,
                std::vector<StorageUse>* storages, std::vector<DeviceDigest>* device) {
  for (size_t arg = 0; arg < values.size(); ++arg) {
    const c10::IValue& v = values[arg];
    const Role role = arg < roles.size() ? roles[arg] : (is_output ? Role::kOutput : Role::kRead);
    std::vector<Captured> captured;
    if (v.isTensorList()) {
      const c10::List<at::Tensor> list = v.toTensorList();
      for (size_t i = 0; i < list.size(); ++i) {
        captured.push_back(Capture(c10::IValue(list.get(i)), static_cast<int>(arg),
                                   static_cast<int>(i), kept->size() + captured.size(), role, op,
                                   window, unwritten, storages, device));
      }
    } else if (v.isList() && !IsScalarLike(v)) {
      const c10::List<c10::IValue> list = v.toList();
      for (size_t i = 0; i < list.size(); ++i) {
        captured.push_back(Capture(list.get(i), static_cast<int>(arg), static_cast<int>(i),
                                   kept->size() + captured.size(), role, op, window, unwritten,
                                   storages, device));
      }
    } else {
      captured.push_back(Capture(v, static_cast<int>(arg), -1, kept->size(), role, op, window,
                                 unwritten, storages, device));
    }
    for (Captured& c : captured) {
      out->push_back(std::move(c.value));
      kept->push_back(std::move(c.kept));
    }
  }
}

at::Tensor SummaryPartialOf(const at::Tensor& t) { return Summary(t).view(at::kByte); }

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
