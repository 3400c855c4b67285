// numerics/compare: every criterion at and just past its boundary (hand-computed), NaN and Inf,
// the floating and integer dtypes, mismatches, empty and zero-dimensional tensors, bitwise mode,
// set comparison and its JSON.

#include "numerics/compare.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ATen/ATen.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace lockstep {
namespace numerics {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

at::Tensor D(std::vector<double> v) { return at::tensor(v, at::kDouble); }

TensorComparison Compare(const at::Tensor& a, const at::Tensor& b, const Tolerance& t) {
  absl::StatusOr<TensorComparison> c = CompareTensors(a, b, t, "t");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : TensorComparison();
}

Tolerance Only(double atol, double rtol, double rel_l2 = 1e9) {
  Tolerance tolerance;
  tolerance.atol = atol;
  tolerance.rtol = rtol;
  tolerance.relative_l2 = rel_l2;
  return tolerance;
}

// The default tolerance with NaN equal to NaN (bitwise mode too, when `bitwise`).
Tolerance NanEqual(bool bitwise = false) {
  Tolerance tolerance;
  tolerance.nan_equal = true;
  tolerance.bitwise = bitwise;
  return tolerance;
}

TEST(CompareTest, AbsoluteToleranceAtAndPastTheBoundary) {
  const Tolerance t = Only(0.25, 0);
  TensorComparison at = Compare(D({1.25}), D({1.0}), t);
  EXPECT_TRUE(at.passed);
  EXPECT_EQ(at.max_abs_diff, 0.25);
  EXPECT_EQ(at.max_tolerance_ratio, 1.0);
  TensorComparison past = Compare(D({std::nextafter(1.25, 2.0)}), D({1.0}), t);
  EXPECT_FALSE(past.passed);
  EXPECT_FALSE(past.elementwise_passed);
  EXPECT_EQ(past.over_tolerance, 1);
  EXPECT_GT(past.max_tolerance_ratio, 1.0);
}

TEST(CompareTest, RelativeToleranceScalesWithTheExpectedValue) {
  const Tolerance t = Only(0, 0.5);
  EXPECT_TRUE(Compare(D({3.0, -3.0}), D({2.0, -2.0}), t).passed);  // |1| <= 0.5 * 2
  EXPECT_FALSE(Compare(D({std::nextafter(3.0, 4.0)}), D({2.0}), t).passed);
  // Relative to `expected`, not to `actual`: 2 vs 3 is |1| > 0.5 * 1.5... checked as 0.5 * 3.
  EXPECT_TRUE(Compare(D({2.0}), D({3.0}), t).passed);
  EXPECT_FALSE(Compare(D({3.0}), D({1.9}), t).passed);
  // atol + rtol * |b| together: 0.1 + 0.5 * 2 = 1.1.
  EXPECT_EQ(Compare(D({3.1}), D({2.0}), Only(0.1, 0.5)).max_tolerance_ratio, 1.1 / 1.1);
}

TEST(CompareTest, RelativeL2AtAndPastTheBoundary) {
  // ||(0, 0.5)|| / ||(3, 4)|| = 0.5 / 5 = 0.1.
  const Tolerance t = Only(1, 0, 0.1);
  TensorComparison at = Compare(D({3, 4.5}), D({3, 4}), t);
  EXPECT_DOUBLE_EQ(at.relative_l2, 0.1);
  EXPECT_TRUE(at.relative_l2_passed);
  EXPECT_TRUE(at.passed);
  TensorComparison past = Compare(D({3, 4.5001}), D({3, 4}), t);
  EXPECT_TRUE(past.elementwise_passed);
  EXPECT_FALSE(past.relative_l2_passed);
  EXPECT_FALSE(past.passed);
  // ||b|| = 0: 0 when a == b, infinite otherwise.
  EXPECT_EQ(Compare(D({0, 0}), D({0, 0}), t).relative_l2, 0);
  EXPECT_EQ(Compare(D({0, 1e-9}), D({0, 0}), t).relative_l2, kInf);
}

// Note [Dividing only for a new maximum]: the largest ratio is the one a division per element
// gives, bit for bit, however the elements are ordered — including ratios a rounding apart,
// allowances so small that the bound is subnormal, and exact ties.
TEST(CompareTest, TheLargestRatioIsTheDivisionsBitForBit) {
  at::manual_seed(3);
  const Tolerance t = Only(1e-300, 0.016);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t n = 20000;
    at::Tensor b = at::randn({n}, at::kDouble) * std::pow(10.0, trial % 7 - 3);
    at::Tensor a = b + 1e-3 * at::randn({n}, at::kDouble) * b.abs();
    if (trial % 4 == 1)
      a = std::get<0>(a.sort()), b = std::get<0>(b.sort());  // ratios rising and falling
    if (trial % 4 == 2) b = b * 1e-305, a = a * 1e-305;      // subnormal allowances
    if (trial % 4 == 3) {
      // Ratios within a rounding of each other: one difference nudged by one ulp at a time.
      b = at::full({n}, 1.0, at::kDouble);
      std::vector<double> values(n);
      double x = 1.0 + 1e-3;
      for (int64_t i = 0; i < n; ++i) values[i] = x = (i % 3 == 0 ? std::nextafter(x, 2.0) : x);
      a = at::tensor(values, at::kDouble);
    }
    const double* pa = a.data_ptr<double>();
    const double* pb = b.data_ptr<double>();
    double expected = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double diff = std::fabs(pa[i] - pb[i]);
      if (pa[i] == pb[i]) continue;
      const double allowed = 1e-300 + 0.016 * std::fabs(pb[i]);
      expected = std::max(expected, diff / allowed);
    }
    EXPECT_EQ(Compare(a, b, t).max_tolerance_ratio, expected) << "trial " << trial;
  }
}

TEST(CompareTest, TheDefaultsAreTheDocumentedOnes) {
  const Tolerance t;
  EXPECT_EQ(t.atol, 1e-5);
  EXPECT_EQ(t.rtol, 0.016);
  EXPECT_EQ(t.relative_l2, 0.03);
  EXPECT_FALSE(t.nan_equal);
  EXPECT_FALSE(t.bitwise);
  Tolerance negative_atol;
  negative_atol.atol = -1;
  EXPECT_THAT(negative_atol.Validate().message(), HasSubstr("atol is -1"));
  Tolerance nan_rtol;
  nan_rtol.rtol = kNan;
  EXPECT_FALSE(nan_rtol.Validate().ok());
  Tolerance infinite_l2;
  infinite_l2.relative_l2 = kInf;
  EXPECT_FALSE(CompareTensors(D({1}), D({1}), infinite_l2).ok());
}

TEST(CompareTest, FirstOffendingIndexIsMultiDimensionalInRowMajorOrder) {
  at::Tensor b = at::zeros({2, 3}, at::kDouble);
  at::Tensor a = b.clone();
  a.index_put_({1, 2}, 1.0);
  a.index_put_({1, 0}, 1.0);
  TensorComparison c = Compare(a, b, Only(0.5, 0));
  EXPECT_EQ(c.over_tolerance, 2);
  EXPECT_THAT(c.first_offending_index, ElementsAre(1, 0));
  EXPECT_TRUE(Compare(b, b, Only(0.5, 0)).first_offending_index.empty());
}

TEST(CompareTest, NanEqualsNanOnlyWhenAsked) {
  TensorComparison strict = Compare(D({kNan, 1}), D({kNan, 1}), Tolerance());
  EXPECT_FALSE(strict.passed);
  EXPECT_EQ(strict.over_tolerance, 1);
  EXPECT_EQ(strict.max_tolerance_ratio, kInf);
  EXPECT_EQ(strict.relative_l2, kInf);
  EXPECT_THAT(strict.first_offending_index, ElementsAre(0));
  TensorComparison lenient = Compare(D({kNan, 1}), D({kNan, 1}), NanEqual());
  EXPECT_TRUE(lenient.passed);
  EXPECT_EQ(lenient.relative_l2, 0);
  // NaN against a number fails either way.
  EXPECT_FALSE(Compare(D({kNan}), D({1}), NanEqual()).passed);
  EXPECT_FALSE(Compare(D({1}), D({kNan}), NanEqual()).passed);
}

TEST(CompareTest, InfinitiesPassOnlyWhenEqual) {
  EXPECT_TRUE(Compare(D({kInf, -kInf, 1}), D({kInf, -kInf, 1}), Tolerance()).passed);
  TensorComparison sign = Compare(D({kInf}), D({-kInf}), Tolerance());
  EXPECT_FALSE(sign.passed);
  EXPECT_EQ(sign.max_abs_diff, kInf);
  // An infinite expected value must not make the allowance infinite.
  EXPECT_FALSE(Compare(D({1e308}), D({kInf}), Tolerance()).passed);
  EXPECT_FALSE(Compare(D({kInf}), D({1e308}), Tolerance()).passed);
}

TEST(CompareTest, ReducedPrecisionAndIntegerDtypes) {
  // One bf16 / fp16 step above 1 is within rtol 0.016 of 1; three bf16 steps are not.
  const at::Tensor one = at::ones({1});
  EXPECT_TRUE(
      Compare(at::full({1}, 1.0078125).to(at::kBFloat16), one.to(at::kBFloat16), Tolerance())
          .passed);
  EXPECT_FALSE(
      Compare(at::full({1}, 1.0234375).to(at::kBFloat16), one.to(at::kBFloat16), Tolerance())
          .passed);
  EXPECT_TRUE(
      Compare(at::full({1}, 1.0009765625).to(at::kHalf), one.to(at::kHalf), Tolerance()).passed);
  EXPECT_FALSE(
      Compare(at::full({1}, 1.03125).to(at::kHalf), one.to(at::kHalf), Tolerance()).passed);
  EXPECT_TRUE(Compare(at::full({2}, 1.0f + 1e-3f), at::ones({2}), Tolerance()).passed);
  EXPECT_FALSE(Compare(at::full({2}, 1.02f), at::ones({2}), Tolerance()).passed);
  // Integers: |5 - 6| = 1 against atol 1 and 0.5.
  const at::Tensor five = at::full({1}, 5, at::kInt), six = at::full({1}, 6, at::kInt);
  EXPECT_TRUE(Compare(five, six, Only(1, 0)).passed);
  EXPECT_FALSE(Compare(five, six, Only(0.5, 0)).passed);
  EXPECT_TRUE(
      Compare(at::full({3}, 7, at::kLong), at::full({3}, 7, at::kLong), Tolerance::Bitwise())
          .passed);
  EXPECT_TRUE(Compare(at::ones({2}, at::kBool), at::ones({2}, at::kBool), Tolerance()).passed);
}

TEST(CompareTest, BitwiseModeSeesSignedZerosAndNanPayloads) {
  TensorComparison zeros = Compare(D({-0.0}), D({0.0}), Tolerance::Bitwise());
  EXPECT_FALSE(zeros.passed);
  EXPECT_TRUE(zeros.elementwise_passed);  // the tolerance figures are still reported
  EXPECT_FALSE(zeros.bitwise_equal);
  EXPECT_EQ(zeros.over_tolerance, 1);
  EXPECT_TRUE(Compare(D({-0.0}), D({0.0}), Tolerance()).passed);
  at::Tensor quiet = D({kNan});
  at::Tensor payload = quiet.clone();
  payload.view(at::kLong).add_(1);  // another NaN
  ASSERT_TRUE(std::isnan(payload.item<double>()));
  EXPECT_TRUE(Compare(payload, quiet, NanEqual()).passed);
  EXPECT_FALSE(Compare(payload, quiet, NanEqual(/*bitwise=*/true)).passed);
  EXPECT_TRUE(Compare(quiet, quiet.clone(), Tolerance::Bitwise()).passed);
}

TEST(CompareTest, MismatchesAreResultsNotConversions) {
  TensorComparison shape = Compare(at::zeros({2, 3}), at::zeros({3, 2}), Tolerance());
  EXPECT_EQ(shape.outcome, TensorComparison::Outcome::kShapeMismatch);
  EXPECT_FALSE(shape.passed);
  EXPECT_EQ(shape.detail, "shape [2, 3] vs [3, 2]");
  TensorComparison dtype = Compare(at::zeros({2}), at::zeros({2}, at::kDouble), Tolerance());
  EXPECT_EQ(dtype.outcome, TensorComparison::Outcome::kDtypeMismatch);
  EXPECT_EQ(dtype.detail, "dtype Float vs Double");
  TensorComparison device =
      Compare(at::empty({2}, at::TensorOptions().device(at::kMeta)), at::zeros({2}), Tolerance());
  EXPECT_EQ(device.outcome, TensorComparison::Outcome::kDeviceMismatch);
  EXPECT_THAT(device.detail, HasSubstr("meta vs cpu"));
  EXPECT_FALSE(CompareTensors(at::Tensor(), at::zeros({1}), Tolerance()).ok());
}

TEST(CompareTest, EmptyAndZeroDimensionalTensors) {
  TensorComparison empty = Compare(at::zeros({0, 4}), at::zeros({0, 4}), Tolerance::Bitwise());
  EXPECT_TRUE(empty.passed);
  EXPECT_EQ(empty.elements, 0);
  TensorComparison scalar = Compare(at::scalar_tensor(2.0), at::scalar_tensor(1.0), Tolerance());
  EXPECT_FALSE(scalar.passed);
  EXPECT_TRUE(scalar.first_offending_index.empty());  // a 0-d tensor has no index
  EXPECT_EQ(scalar.over_tolerance, 1);
}

TEST(CompareSetTest, MissingAndExtraNamesFailAndTheWorstComeFirst) {
  const NamedTensors actual = {{"a", D({1.0})}, {"b", D({1.1})}, {"c", D({2.0})}, {"x", D({0})}};
  const NamedTensors expected = {{"a", D({1.0})}, {"b", D({1.0})}, {"c", D({1.0})}, {"y", D({0})}};
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(SetComparison s, CompareTensorSets(actual, expected, Tolerance()));
  EXPECT_EQ(s.passed, 1);
  EXPECT_EQ(s.failed, 4);
  EXPECT_FALSE(s.all_passed());
  EXPECT_THAT(s.WorstByToleranceRatio(2), ElementsAre("c", "b"));
  EXPECT_THAT(s.WorstByRelativeL2(5), ElementsAre("c", "b", "a"));
  const nlohmann::json j = SetComparisonJson(s);
  EXPECT_EQ(j["failed"], 4);
  EXPECT_EQ(j["tolerance"]["rtol"], 0.016);
  EXPECT_EQ(j["tensors"][3]["outcome"], "extra");
  EXPECT_EQ(j["tensors"][4]["outcome"], "missing");
  EXPECT_EQ(j["tensors"][2]["name"], "c");
  EXPECT_EQ(j["tensors"][2]["first_offending_index"], nlohmann::json::array({0}));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      SetComparison nan, CompareTensorSets({{"n", D({kNan})}}, {{"n", D({kNan})}}, Tolerance()));
  EXPECT_EQ(SetComparisonJson(nan)["tensors"][0]["relative_l2"], "inf");
  EXPECT_THAT(CompareTensorSets({{"a", D({1})}, {"a", D({1})}}, {}, Tolerance()).status().message(),
              HasSubstr("'a' appears twice in actual"));
}

}  // namespace
}  // namespace numerics
}  // namespace lockstep
