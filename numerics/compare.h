// numerics/compare.h
//
// Strict comparison of tensors under a declared tolerance, with the figures that show how close
// they are: the oracle behind `compare`, the repeatability harness and qualify.
//
// `actual` is compared with `expected` (the reference). Under a Tolerance a tensor passes when
//   - elementwise: every element satisfies |a - b| <= atol + rtol * |b|, and
//   - relative L2: ||a - b||_2 / ||b||_2 <= relative_l2 (0 when both norms are 0, infinite when
//     only the difference's is),
// with the arithmetic in float64 on the tensors' own device (only reductions come to the host).
// Elements that are exactly equal (equal infinities included) always pass; NaN equals NaN only
// with nan_equal; any other non-finite pair (NaN against anything, an infinity against another
// value) fails and makes the maximum difference, ratio and relative L2 infinite. In bitwise mode
// a tensor passes only when every element's bytes are equal (NaN payloads and -0.0 included);
// the other figures are still reported. Integers are compared through float64 (exact up to 2^53;
// use bitwise mode for exact int64 comparison).
//
// Shape, dtype and device mismatches are results (failures), not errors: nothing is converted
// silently.
//
// Thread-safety: stateless functions; results are values.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(numerics::TensorComparison c,
//                             numerics::CompareTensors(actual, expected, numerics::Tolerance()));
//   if (!c.passed) LOCKSTEP_LOG(ERROR) << c.Summary();

#ifndef LOCKSTEP_NUMERICS_COMPARE_H_
#define LOCKSTEP_NUMERICS_COMPARE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"
#include "numerics/named_tensors.h"

namespace lockstep {
namespace numerics {

// The limits a comparison holds `actual` to (see the top of this file): the elementwise atol and
// rtol, the relative L2 bound, whether NaN equals NaN, and bitwise mode. CompareTensors checks the
// limits with Validate. A default-constructed Tolerance holds every default below.
struct Tolerance {
  // Bitwise equality; the other limits at their defaults.
  static Tolerance Bitwise() {
    Tolerance tolerance;
    tolerance.bitwise = true;
    return tolerance;
  }

  // kInvalidArgument naming the field for a negative or non-finite limit.
  absl::Status Validate() const;

  // The absolute allowance of the elementwise criterion, in the tensors' own units (finite,
  // >= 0). Default: 1e-5.
  double atol = 1e-5;
  // The elementwise allowance relative to |expected|, a fraction (finite, >= 0). Default: 0.016.
  double rtol = 0.016;
  // The largest ||a - b||_2 / ||b||_2 that passes (finite, >= 0). Default: 0.03.
  double relative_l2 = 0.03;
  // Whether a NaN in `actual` equals a NaN at the same position of `expected`. Default: false.
  bool nan_equal = false;
  // Bitwise mode: a tensor passes only when every element's bytes are equal, and the other limits
  // decide nothing (their figures are still reported). Default: false.
  bool bitwise = false;
};

// What comparing one pair found.
struct TensorComparison {
  // Whether the pair was compared, or why not; every outcome but kCompared is a failure.
  enum class Outcome {
    kCompared,        // same shape, dtype and device: the figures below hold
    kShapeMismatch,   // same dtype, different shapes
    kDtypeMismatch,   // different dtypes (checked first)
    kDeviceMismatch,  // same dtype and shape, different devices
    kMissing,         // in the expected set only
    kExtra,           // in the actual set only
  };
  // The pair's name: CompareTensors' `name`, or the name in the sets.
  std::string name;
  // Whether the pair was compared, or why not.
  Outcome outcome = Outcome::kCompared;
  // The verdict: in bitwise mode bitwise_equal, otherwise elementwise_passed and
  // relative_l2_passed; always false for an outcome other than kCompared.
  bool passed = false;
  // The elementwise criterion's verdict (kCompared only): every element within atol + rtol * |b|.
  bool elementwise_passed = false;
  // relative_l2 <= the tolerance's relative_l2 (kCompared only).
  bool relative_l2_passed = false;
  // Every element's bytes equal (kCompared only; reported in either mode).
  bool bitwise_equal = false;
  // The number of elements compared (0 for an outcome other than kCompared).
  int64_t elements = 0;
  // Elements failing the elementwise criterion (bitwise mode: elements whose bytes differ).
  int64_t over_tolerance = 0;
  // max |a - b| over the elements, in the tensors' units (infinite when a non-finite pair fails).
  double max_abs_diff = 0;
  // max |a - b| / (atol + rtol * |b|): <= 1 passes (infinite where the allowance is 0 and the
  // difference is not).
  double max_tolerance_ratio = 0;
  // ||a - b||_2 / ||b||_2: 0 when both norms are 0, infinite when only the difference's is or
  // when a non-finite pair fails.
  double relative_l2 = 0;
  // Multi-dimensional index of the first failing element in row-major order; empty if none.
  std::vector<int64_t> first_offending_index;
  // For a mismatch: what differs ("shape [2, 3] vs [3, 2]").
  std::string detail;

  // One line: name, verdict and the figures.
  std::string Summary() const;
};

// "compared", "shape_mismatch", "dtype_mismatch", "device_mismatch", "missing" or "extra" (the
// JSON's outcome).
std::string OutcomeName(TensorComparison::Outcome outcome);

// Compares `actual` with `expected` (see the top of this file). Errors only for an invalid
// tolerance, an undefined tensor, a dtype the comparison cannot take (complex), or LibTorch
// failing (with context).
absl::StatusOr<TensorComparison> CompareTensors(const at::Tensor& actual,
                                                const at::Tensor& expected,
                                                const Tolerance& tolerance, std::string name = "");

// Comparison of two named sets: every name in either, sorted by name; a name in only one set is
// a failure (kMissing / kExtra).
struct SetComparison {
  // The tolerance the sets were compared under.
  Tolerance tolerance;
  // One comparison per name in either set, sorted by name.
  std::vector<TensorComparison> tensors;
  // How many of `tensors` passed.
  int passed = 0;
  // How many of `tensors` failed (a kMissing or kExtra name included).
  int failed = 0;
  // Whether every tensor passed (none failed).
  bool all_passed() const { return failed == 0; }
  // Names of the (up to `n`) compared tensors (kCompared) with the largest max_tolerance_ratio,
  // worst first; ties keep name order.
  std::vector<std::string> WorstByToleranceRatio(size_t n) const;
  // Names of the (up to `n`) compared tensors (kCompared) with the largest relative_l2, worst
  // first; ties keep name order.
  std::vector<std::string> WorstByRelativeL2(size_t n) const;
};

// kInvalidArgument for a duplicate name within one set; otherwise as CompareTensors.
absl::StatusOr<SetComparison> CompareTensorSets(const NamedTensors& actual,
                                                const NamedTensors& expected,
                                                const Tolerance& tolerance);

// JSON of a tolerance: {atol, rtol, relative_l2, nan_equal, bitwise}.
nlohmann::json ToleranceJson(const Tolerance& tolerance);
// JSON of a comparison: {name, outcome (OutcomeName), passed, elementwise_passed,
// relative_l2_passed, bitwise_equal, elements, over_tolerance, max_abs_diff,
// max_tolerance_ratio, relative_l2, first_offending_index, detail}. An infinite figure is the
// string "inf" (JSON has no infinity); NaN never occurs.
nlohmann::json ComparisonJson(const TensorComparison& comparison);
// JSON of a set comparison: {tolerance (ToleranceJson), passed, failed, all_passed,
// worst_by_tolerance_ratio, worst_by_relative_l2 (up to 10 names each), tensors: [ComparisonJson
// of each...]}.
nlohmann::json SetComparisonJson(const SetComparison& comparison);

}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_COMPARE_H_
