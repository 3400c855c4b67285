#include "numerics/compare.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/json.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "nlohmann/json.hpp"
#include "numerics/internal/compare_device.h"

namespace lockstep {
namespace numerics {
namespace {

using json = nlohmann::json;
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string Shape(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

std::vector<int64_t> Unravel(int64_t flat, at::IntArrayRef sizes) {
  std::vector<int64_t> index(sizes.size());
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    index[d] = flat % sizes[d];
    flat /= sizes[d];
  }
  return index;
}

// Bits of an element, for the bitwise criterion.
template <typename T>
uint64_t BitsOf(const T& v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}

// Compares elements [begin, end) of two contiguous CPU buffers of T.
template <typename T>
internal::ComparePartial CompareRange(const T* a, const T* b, int64_t begin, int64_t end,
                                      const internal::CompareParams& params) {
  internal::ComparePartial p;
  for (int64_t i = begin; i < end; ++i) {
    internal::VisitElement(static_cast<double>(a[i]), static_cast<double>(b[i]),
                           BitsOf(a[i]) == BitsOf(b[i]), i, params, p);
  }
  return p;
}

// The figures of two contiguous CPU tensors of one shape and dtype: fixed blocks of
// kCpuCompareBlock elements hashed out to LibTorch's threads, reduced in block order so that the
// sums do not depend on the thread count.
constexpr int64_t kCpuCompareBlock = 1 << 16;

template <typename T>
internal::ComparePartial CompareCpu(const at::Tensor& a, const at::Tensor& b,
                                    const internal::CompareParams& params) {
  const T* pa = a.data_ptr<T>();
  const T* pb = b.data_ptr<T>();
  const int64_t n = a.numel();
  const int64_t blocks = (n + kCpuCompareBlock - 1) / kCpuCompareBlock;
  std::vector<internal::ComparePartial> partials(blocks);
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t k = first; k < last; ++k) {
      partials[k] = CompareRange(pa, pb, k * kCpuCompareBlock,
                                 std::min(n, (k + 1) * kCpuCompareBlock), params);
    }
  });
  internal::ComparePartial total;
  for (const internal::ComparePartial& p : partials) internal::MergePartial(total, p);
  return total;
}

}  // namespace

namespace internal {

void FillComparison(const ComparePartial& total, const Tolerance& tol, at::IntArrayRef sizes,
                    TensorComparison& out) {
  out.bitwise_equal = total.bit_differs == 0;
  out.over_tolerance = tol.bitwise ? total.bit_differs : total.over;
  out.max_abs_diff = total.max_diff;
  out.max_tolerance_ratio = total.max_ratio;
  if (total.nonfinite > 0) {
    out.relative_l2 = kInf;
  } else {
    // Equal infinities make ||b|| infinite and the ratio 0; settled NaNs count in neither norm.
    const double numerator = std::sqrt(total.sum_diff2);
    const double denominator = std::sqrt(total.sum_b2);
    out.relative_l2 = denominator > 0 ? numerator / denominator : (numerator == 0 ? 0 : kInf);
  }
  out.elementwise_passed = total.over == 0;
  out.relative_l2_passed = out.relative_l2 <= tol.relative_l2;
  const int64_t first = tol.bitwise ? total.first_bit_diff : total.first_over;
  if (first >= 0 && !sizes.empty()) out.first_offending_index = Unravel(first, sizes);
  out.passed = tol.bitwise ? out.bitwise_equal : out.elementwise_passed && out.relative_l2_passed;
}

}  // namespace internal

namespace {

absl::Status MeasureCpu(const at::Tensor& actual, const at::Tensor& expected, const Tolerance& tol,
                        TensorComparison& out) {
  const internal::CompareParams params{tol.atol, tol.rtol, tol.nan_equal};
  internal::ComparePartial total;
  const at::Tensor a = actual.contiguous();
  const at::Tensor b = expected.contiguous();
  switch (a.scalar_type()) {
    case at::kDouble:
      total = CompareCpu<double>(a, b, params);
      break;
    case at::kFloat:
      total = CompareCpu<float>(a, b, params);
      break;
    case at::kHalf:
      total = CompareCpu<at::Half>(a, b, params);
      break;
    case at::kBFloat16:
      total = CompareCpu<at::BFloat16>(a, b, params);
      break;
    case at::kLong:
      total = CompareCpu<int64_t>(a, b, params);
      break;
    case at::kInt:
      total = CompareCpu<int32_t>(a, b, params);
      break;
    case at::kShort:
      total = CompareCpu<int16_t>(a, b, params);
      break;
    case at::kChar:
      total = CompareCpu<int8_t>(a, b, params);
      break;
    case at::kByte:
      total = CompareCpu<uint8_t>(a, b, params);
      break;
    case at::kBool:
      total = CompareCpu<bool>(a, b, params);
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", c10::toString(a.scalar_type()), " cannot be compared"));
  }
  internal::FillComparison(total, tol, a.sizes(), out);
  return absl::OkStatus();
}

}  // namespace

absl::Status Tolerance::Validate() const {
  for (const auto& [name, value] : {std::pair<const char*, double>{"atol", atol},
                                    {"rtol", rtol},
                                    {"relative_l2", relative_l2}}) {
    if (!(std::isfinite(value) && value >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tolerance ", name, " is ", value, "; it must be finite and >= 0"));
    }
  }
  return absl::OkStatus();
}

std::string OutcomeName(TensorComparison::Outcome outcome) {
  switch (outcome) {
    case TensorComparison::Outcome::kCompared:
      return "compared";
    case TensorComparison::Outcome::kShapeMismatch:
      return "shape_mismatch";
    case TensorComparison::Outcome::kDtypeMismatch:
      return "dtype_mismatch";
    case TensorComparison::Outcome::kDeviceMismatch:
      return "device_mismatch";
    case TensorComparison::Outcome::kMissing:
      return "missing";
    case TensorComparison::Outcome::kExtra:
      return "extra";
  }
  return "unknown";
}

std::string TensorComparison::Summary() const {
  if (outcome != Outcome::kCompared) {
    return absl::StrCat(name, ": FAIL ", OutcomeName(outcome), " (", detail, ")");
  }
  std::string line =
      absl::StrCat(name, ": ", passed ? "PASS" : "FAIL", " ", over_tolerance, "/", elements,
                   " over tolerance, max |a-b| ", max_abs_diff, ", max ratio ", max_tolerance_ratio,
                   ", relative L2 ", relative_l2, bitwise_equal ? ", bitwise equal" : "");
  if (!first_offending_index.empty()) {
    absl::StrAppend(&line, ", first at [", absl::StrJoin(first_offending_index, ", "), "]");
  }
  return line;
}

absl::StatusOr<TensorComparison> CompareTensors(const at::Tensor& actual,
                                                const at::Tensor& expected,
                                                const Tolerance& tolerance, std::string name) {
  LOCKSTEP_RETURN_IF_ERROR(tolerance.Validate());
  if (!actual.defined() || !expected.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("comparing '", name, "': a tensor is undefined"));
  }
  TensorComparison out;
  out.name = std::move(name);
  if (actual.scalar_type() != expected.scalar_type()) {
    out.outcome = TensorComparison::Outcome::kDtypeMismatch;
    out.detail = absl::StrCat("dtype ", c10::toString(actual.scalar_type()), " vs ",
                              c10::toString(expected.scalar_type()));
    return out;
  }
  if (actual.sizes() != expected.sizes()) {
    out.outcome = TensorComparison::Outcome::kShapeMismatch;
    out.detail = absl::StrCat("shape ", Shape(actual), " vs ", Shape(expected));
    return out;
  }
  if (actual.device() != expected.device()) {
    out.outcome = TensorComparison::Outcome::kDeviceMismatch;
    out.detail = absl::StrCat("device ", actual.device().str(), " vs ", expected.device().str());
    return out;
  }
  if (actual.is_complex()) {
    return absl::InvalidArgumentError(absl::StrCat("comparing '", out.name, "': complex dtype ",
                                                   c10::toString(actual.scalar_type()),
                                                   " is not supported"));
  }
  out.elements = actual.numel();
  if (actual.numel() == 0) {
    internal::FillComparison(internal::ComparePartial(), tolerance, actual.sizes(), out);
    return out;
  }
  {
    // CUDA tensors: one fused pass on the device (numerics/internal/compare_device.h).
    absl::StatusOr<bool> on_device = internal::MeasureOnDevice(actual, expected, tolerance, out);
    if (!on_device.ok())
      return Annotate(on_device.status(), absl::StrCat("comparing '", out.name, "'"));
    if (*on_device) return out;
  }
  if (!actual.is_cpu()) {
    return absl::FailedPreconditionError(
        absl::StrCat("comparing '", out.name, "': tensors on ", actual.device().str(),
                     " can be compared only on the CPU or (CUDA builds) a CUDA device"));
  }
  absl::Status measured = absl::OkStatus();
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(absl::StrCat("comparing '", out.name, "'"), [&] {
    measured = MeasureCpu(actual, expected, tolerance, out);
  }));
  LOCKSTEP_RETURN_IF_ERROR(measured);
  return out;
}

std::vector<std::string> SetComparison::WorstByToleranceRatio(size_t n) const {
  std::vector<const TensorComparison*> compared;
  for (const TensorComparison& t : tensors) {
    if (t.outcome == TensorComparison::Outcome::kCompared) compared.push_back(&t);
  }
  std::stable_sort(compared.begin(), compared.end(), [](auto* x, auto* y) {
    return x->max_tolerance_ratio > y->max_tolerance_ratio;
  });
  std::vector<std::string> names;
  for (size_t i = 0; i < std::min(n, compared.size()); ++i) names.push_back(compared[i]->name);
  return names;
}

std::vector<std::string> SetComparison::WorstByRelativeL2(size_t n) const {
  std::vector<const TensorComparison*> compared;
  for (const TensorComparison& t : tensors) {
    if (t.outcome == TensorComparison::Outcome::kCompared) compared.push_back(&t);
  }
  std::stable_sort(compared.begin(), compared.end(),
                   [](auto* x, auto* y) { return x->relative_l2 > y->relative_l2; });
  std::vector<std::string> names;
  for (size_t i = 0; i < std::min(n, compared.size()); ++i) names.push_back(compared[i]->name);
  return names;
}

absl::StatusOr<SetComparison> CompareTensorSets(const NamedTensors& actual,
                                                const NamedTensors& expected,
                                                const Tolerance& tolerance) {
  LOCKSTEP_RETURN_IF_ERROR(tolerance.Validate());
  std::map<std::string, const at::Tensor*> a, b;
  for (const auto& [name, tensor] : actual) {
    if (!a.emplace(name, &tensor).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' appears twice in actual"));
    }
  }
  for (const auto& [name, tensor] : expected) {
    if (!b.emplace(name, &tensor).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' appears twice in expected"));
    }
  }
  SetComparison out;
  out.tolerance = tolerance;
  std::map<std::string, bool> names;
  for (const auto& [name, unused] : a) names[name] = true;
  for (const auto& [name, unused] : b) names[name] = true;
  for (const auto& [name, unused] : names) {
    TensorComparison result;
    result.name = name;
    if (!b.count(name)) {
      result.outcome = TensorComparison::Outcome::kExtra;
      result.detail = "only in actual";
    } else if (!a.count(name)) {
      result.outcome = TensorComparison::Outcome::kMissing;
      result.detail = "only in expected";
    } else {
      LOCKSTEP_ASSIGN_OR_RETURN(result, CompareTensors(*a[name], *b[name], tolerance, name));
    }
    (result.passed ? out.passed : out.failed) += 1;
    out.tensors.push_back(std::move(result));
  }
  return out;
}

json ToleranceJson(const Tolerance& t) {
  return {{"atol", t.atol},
          {"rtol", t.rtol},
          {"relative_l2", t.relative_l2},
          {"nan_equal", t.nan_equal},
          {"bitwise", t.bitwise}};
}

json ComparisonJson(const TensorComparison& c) {
  return {{"name", c.name},
          {"outcome", OutcomeName(c.outcome)},
          {"passed", c.passed},
          {"elementwise_passed", c.elementwise_passed},
          {"relative_l2_passed", c.relative_l2_passed},
          {"bitwise_equal", c.bitwise_equal},
          {"elements", c.elements},
          {"over_tolerance", c.over_tolerance},
          {"max_abs_diff", JsonFigure(c.max_abs_diff)},
          {"max_tolerance_ratio", JsonFigure(c.max_tolerance_ratio)},
          {"relative_l2", JsonFigure(c.relative_l2)},
          {"first_offending_index", c.first_offending_index},
          {"detail", c.detail}};
}

json SetComparisonJson(const SetComparison& s) {
  json tensors = json::array();
  for (const TensorComparison& c : s.tensors) tensors.push_back(ComparisonJson(c));
  return {{"tolerance", ToleranceJson(s.tolerance)},
          {"passed", s.passed},
          {"failed", s.failed},
          {"all_passed", s.all_passed()},
          {"worst_by_tolerance_ratio", s.WorstByToleranceRatio(10)},
          {"worst_by_relative_l2", s.WorstByRelativeL2(10)},
          {"tensors", tensors}};
}

}  // namespace numerics
}  // namespace lockstep
