#include "numerics/compare.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "nlohmann/json.hpp"

namespace lockstep {
namespace numerics {
namespace {

using json = nlohmann::json;
constexpr double kInf = std::numeric_limits<double>::infinity();

// The integer dtype of the same width, for comparing bytes.
at::ScalarType BitsType(at::ScalarType dtype) {
  switch (c10::elementSize(dtype)) {
    case 1:
      return at::kByte;
    case 2:
      return at::kShort;
    case 4:
      return at::kInt;
    default:
      return at::kLong;
  }
}

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

json Figure(double value) {
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return value;
}

// The figures of two tensors of one shape, dtype and device.
void Measure(const at::Tensor& actual, const at::Tensor& expected, const Tolerance& tol,
             TensorComparison& out) {
  out.elements = actual.numel();
  const at::Tensor a = actual.contiguous();
  const at::Tensor b = expected.contiguous();
  const at::Tensor a_bits = a.view(BitsType(a.scalar_type()));
  const at::Tensor b_bits = b.view(BitsType(b.scalar_type()));
  const at::Tensor bit_differs = a_bits.ne(b_bits);
  out.bitwise_equal = out.elements == 0 || !bit_differs.any().item<bool>();
  if (out.elements == 0) {
    out.elementwise_passed = out.relative_l2_passed = true;
    out.passed = true;
    return;
  }
  const at::Tensor a64 = a.to(at::kDouble);
  const at::Tensor b64 = b.to(at::kDouble);
  // Pairs that pass whatever the tolerance: exactly equal, or NaN against NaN when asked.
  at::Tensor settled = a.eq(b);
  if (tol.nan_equal() && a.is_floating_point()) {
    settled = settled.logical_or(a64.isnan().logical_and(b64.isnan()));
  }
  const at::Tensor unsettled_nonfinite =
      settled.logical_not().logical_and(a64.isfinite().logical_and(b64.isfinite()).logical_not());
  const bool any_nonfinite = unsettled_nonfinite.any().item<bool>();
  // |a - b| where it counts; 0 where settled; +inf for unsettled non-finite pairs.
  at::Tensor diff = at::where(settled, at::zeros_like(a64), (a64 - b64).abs());
  diff = at::where(unsettled_nonfinite, at::full_like(diff, kInf), diff);
  const at::Tensor allowed =
      tol.atol() + tol.rtol() * at::where(settled, at::zeros_like(b64), b64.abs());
  const at::Tensor failing = diff.gt(allowed).logical_or(unsettled_nonfinite);
  const at::Tensor offending = tol.bitwise() ? bit_differs : failing;
  out.over_tolerance = offending.sum().item<int64_t>();
  out.max_abs_diff = diff.max().item<double>();
  // diff / allowed, with 0 / 0 = 0 and x / 0 = inf for x > 0.
  const at::Tensor ratio =
      at::where(allowed.gt(0), diff / allowed,
                at::where(diff.gt(0), at::full_like(diff, kInf), at::zeros_like(diff)));
  out.max_tolerance_ratio = ratio.max().item<double>();
  if (any_nonfinite) {
    out.relative_l2 = kInf;
  } else {
    // Settled NaN pairs count as 0 in both norms; equal infinities make ||b|| infinite.
    const double numerator = diff.norm().item<double>();
    const double denominator =
        at::where(settled.logical_and(b64.isnan()), at::zeros_like(b64), b64).norm().item<double>();
    out.relative_l2 = denominator > 0 ? numerator / denominator : (numerator == 0 ? 0 : kInf);
  }
  out.elementwise_passed = tol.bitwise() ? !failing.any().item<bool>() : out.over_tolerance == 0;
  out.relative_l2_passed = out.relative_l2 <= tol.relative_l2();
  if (out.over_tolerance > 0) {
    const int64_t flat = offending.reshape({-1}).to(at::kByte).argmax().item<int64_t>();
    out.first_offending_index = Unravel(flat, a.sizes());
  }
  out.passed = tol.bitwise() ? out.bitwise_equal : out.elementwise_passed && out.relative_l2_passed;
}

}  // namespace

absl::Status Tolerance::Validate() const {
  for (const auto& [name, value] : {std::pair<const char*, double>{"atol", atol_},
                                    {"rtol", rtol_},
                                    {"relative_l2", relative_l2_}}) {
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
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(absl::StrCat("comparing '", out.name, "'"),
                                     [&] { Measure(actual, expected, tolerance, out); }));
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
  return {{"atol", t.atol()},
          {"rtol", t.rtol()},
          {"relative_l2", t.relative_l2()},
          {"nan_equal", t.nan_equal()},
          {"bitwise", t.bitwise()}};
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
          {"max_abs_diff", Figure(c.max_abs_diff)},
          {"max_tolerance_ratio", Figure(c.max_tolerance_ratio)},
          {"relative_l2", Figure(c.relative_l2)},
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
