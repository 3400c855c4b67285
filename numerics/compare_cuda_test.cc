// The fused CUDA comparison gives CompareTensors' CPU figures for the same data: every dtype,
// NaN/Inf, bitwise mode, first offending index, and a large tensor.

#include <cmath>
#include <limits>

#include "ATen/ATen.h"
#include "base/status_testutil.h"
#include "gtest/gtest.h"
#include "numerics/compare.h"

namespace lockstep {
namespace numerics {
namespace {

void ExpectSameFigures(const at::Tensor& a, const at::Tensor& b, const Tolerance& tol) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(TensorComparison cpu, CompareTensors(a, b, tol));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(TensorComparison gpu,
                                CompareTensors(a.to(at::kCUDA), b.to(at::kCUDA), tol));
  EXPECT_EQ(gpu.passed, cpu.passed) << cpu.Summary() << " | " << gpu.Summary();
  EXPECT_EQ(gpu.elementwise_passed, cpu.elementwise_passed);
  EXPECT_EQ(gpu.relative_l2_passed, cpu.relative_l2_passed);
  EXPECT_EQ(gpu.bitwise_equal, cpu.bitwise_equal);
  EXPECT_EQ(gpu.over_tolerance, cpu.over_tolerance);
  EXPECT_EQ(gpu.max_abs_diff, cpu.max_abs_diff);
  EXPECT_EQ(gpu.max_tolerance_ratio, cpu.max_tolerance_ratio);
  if (std::isinf(cpu.relative_l2)) {
    EXPECT_EQ(gpu.relative_l2, cpu.relative_l2);
  } else {
    EXPECT_NEAR(gpu.relative_l2, cpu.relative_l2, 1e-12 * std::max(1.0, cpu.relative_l2));
  }
  EXPECT_EQ(gpu.first_offending_index, cpu.first_offending_index);
}

TEST(CompareCudaTest, FiguresMatchTheCpuPathForEveryDtype) {
  at::manual_seed(4);
  const at::Tensor base = at::randn({37, 41}, at::kDouble);
  const at::Tensor near = base + 1e-3 * at::randn({37, 41}, at::kDouble);
  for (at::ScalarType t : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16}) {
    ExpectSameFigures(near.to(t), base.to(t), Tolerance());
    ExpectSameFigures(near.to(t), base.to(t), Tolerance::Bitwise());
    ExpectSameFigures(base.to(t), base.to(t), Tolerance::Bitwise());
  }
  const at::Tensor ints = at::randint(-100, 100, {1000}, at::kLong);
  const at::Tensor other = ints + (at::rand({1000}) < 0.01).to(at::kLong);
  for (at::ScalarType t : {at::kLong, at::kInt, at::kShort, at::kChar}) {
    ExpectSameFigures(other.to(t), ints.to(t), [] {
      Tolerance tolerance;
      tolerance.atol = 0.5;
      tolerance.rtol = 0;
      return tolerance;
    }());
  }
  ExpectSameFigures(other.abs().to(at::kByte), ints.abs().to(at::kByte), Tolerance());
  ExpectSameFigures(other.gt(0), ints.gt(0), Tolerance());
}

TEST(CompareCudaTest, NanInfAndTheFirstOffendingIndex) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const at::Tensor a = at::tensor({1.0, nan, inf, -inf, 2.0, nan}, at::kDouble).reshape({2, 3});
  const at::Tensor b = at::tensor({1.0, nan, inf, inf, 3.0, 1.0}, at::kDouble).reshape({2, 3});
  Tolerance nan_equal;
  nan_equal.nan_equal = true;
  ExpectSameFigures(a, b, Tolerance());
  ExpectSameFigures(a, b, nan_equal);
  const at::Tensor settled = at::tensor({nan, inf, 0.0}, at::kDouble);
  ExpectSameFigures(settled, settled.clone(), nan_equal);
  ExpectSameFigures(at::tensor({-0.0}), at::tensor({0.0}), Tolerance::Bitwise());
}

// The kernel reads 16-byte vectors where both inputs are aligned and element by element
// elsewhere: views at an offset (one input or both) and lengths that leave a tail give the CPU's
// figures, the first offending index included, wherever the offending elements fall.
TEST(CompareCudaTest, OffsetViewsAndTailsGiveTheCpuFigures) {
  at::manual_seed(5);
  const int64_t n = 10007;
  const at::Tensor base = at::randn({n + 1}, at::kDouble);
  for (at::ScalarType t : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kChar}) {
    const at::Tensor expected = (t == at::kChar ? base * 20 : base).to(t);
    for (std::vector<int64_t> planted : {std::vector<int64_t>{}, std::vector<int64_t>{9000, 10005},
                                         std::vector<int64_t>{3, 10006}}) {
      at::Tensor actual = expected.clone();
      for (int64_t i : planted) actual.index_put_({i + 1}, expected[i + 1].item<double>() + 7.0);
      const at::Tensor a_cuda = actual.to(at::kCUDA), b_cuda = expected.to(at::kCUDA);
      SCOPED_TRACE(testing::Message() << t << ", " << planted.size() << " planted");
      for (const auto& [a_view, b_view] :
           {std::make_pair(a_cuda.narrow(0, 1, n), b_cuda.narrow(0, 1, n)),
            std::make_pair(a_cuda.narrow(0, 1, n), b_cuda.narrow(0, 1, n).clone()),
            std::make_pair(a_cuda.narrow(0, 0, n), b_cuda.narrow(0, 0, n))}) {
        LOCKSTEP_ASSERT_OK_AND_ASSIGN(TensorComparison gpu,
                                      CompareTensors(a_view, b_view, Tolerance()));
        LOCKSTEP_ASSERT_OK_AND_ASSIGN(TensorComparison cpu,
                                      CompareTensors(a_view.cpu(), b_view.cpu(), Tolerance()));
        EXPECT_EQ(gpu.over_tolerance, cpu.over_tolerance);
        EXPECT_EQ(gpu.first_offending_index, cpu.first_offending_index);
        EXPECT_EQ(gpu.max_abs_diff, cpu.max_abs_diff);
        EXPECT_EQ(gpu.bitwise_equal, cpu.bitwise_equal);
      }
    }
  }
}

TEST(CompareCudaTest, ALargeTensorWithOneFailingElement) {
  at::Tensor b = at::randn({1 << 24}, at::TensorOptions().device(at::kCUDA));
  at::Tensor a = b.clone();
  a.index_put_({12345678}, b[12345678].item<float>() + 1.0f);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(TensorComparison c, CompareTensors(a, b, Tolerance()));
  EXPECT_FALSE(c.passed);
  EXPECT_EQ(c.over_tolerance, 1);
  EXPECT_EQ(c.first_offending_index, std::vector<int64_t>{12345678});
  ExpectSameFigures(a.cpu(), b.cpu(), Tolerance());
}

}  // namespace
}  // namespace numerics
}  // namespace lockstep
