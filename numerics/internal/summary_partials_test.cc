// FinishSummaryPartials (summary_partials.h): partials added in order, the largest max |x|, and
// a NaN in any partial making both figures NaN.

#include "numerics/internal/summary_partials.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lockstep {
namespace numerics {
namespace internal {
namespace {

std::string Partials(const std::vector<double>& values) {  // sum, max, sum, max, ...
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double));
}

TEST(FinishSummaryPartialsTest, AddsTheSumsAndKeepsTheLargestMax) {
  const auto [sum, max_abs] = FinishSummaryPartials(Partials({1.5, 2.0, -4.0, 7.0, 0.25, 3.0}));
  EXPECT_EQ(sum, -2.25);
  EXPECT_EQ(max_abs, 7.0);
}

TEST(FinishSummaryPartialsTest, AddsInBlockOrder) {
  // 1e16 + 1 + 1 - 1e16 is 0 in that order (each 1 is lost), 2 in another: the order is fixed.
  const auto [sum, max_abs] =
      FinishSummaryPartials(Partials({1e16, 1e16, 1, 1, 1, 1, -1e16, 1e16}));
  EXPECT_EQ(sum, 0.0);
  EXPECT_EQ(max_abs, 1e16);
}

TEST(FinishSummaryPartialsTest, ANanInAnyPartialMakesTheMaxNan) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(std::isnan(FinishSummaryPartials(Partials({1, 1, nan, nan, 2, 5})).second));
  EXPECT_TRUE(std::isnan(FinishSummaryPartials(Partials({1, 1, 2, 5, nan, nan})).second));
  EXPECT_TRUE(std::isnan(FinishSummaryPartials(Partials({1, 1, 2, 5, nan, nan})).first));
}

TEST(FinishSummaryPartialsTest, NoPartialsAreZeros) {
  const auto [sum, max_abs] = FinishSummaryPartials("");
  EXPECT_EQ(sum, 0.0);
  EXPECT_EQ(max_abs, 0.0);
}

}  // namespace
}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
