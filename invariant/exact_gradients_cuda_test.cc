// ExactGradients on a CUDA parameter (invariant/exact_gradients.h, "Where"): deposits from the
// parameter's device are summed there, by the host's integer rounding. Each check pairs the
// device's deposits with the host's deposits of the negated contributions (rounding to nearest,
// ties to even, is symmetric), so that the sums are exactly zero only where every contribution
// rounded to the same integer on both.

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "base/status_macros.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "invariant/exact_gradients.h"
#include "testing/fake_communicator.h"
#include "torch/cuda.h"

namespace lockstep {
namespace invariant {
namespace {

using ::testing::HasSubstr;

class ExactGradientsCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
  const at::Device cuda_{at::kCUDA, 0};
};

// float32 values over 2^-60 .. 2^10 (their products round at 2^-80, some to ties), a tenth zero.
at::Tensor WideRange(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  const at::Tensor exponent = at::randint(-60, 10, shape, g).to(at::kFloat);
  const at::Tensor keep = at::rand(shape, g).ge(0.1).to(at::kFloat);
  return at::randn(shape, g) * at::exp2(exponent) * keep;
}

bool AllZero(const at::Tensor& t) { return t.eq(0).all().item<bool>(); }

TEST_F(ExactGradientsCudaTest, OuterProductsOnTheDeviceRoundAsTheHost) {
  const at::Tensor a = WideRange({300, 37}, 1), b = WideRange({300, 45}, 2);
  const at::Tensor w = at::zeros({37, 45}, cuda_).requires_grad_(true);
  ExactGradients exact({{"w", w}});
  LOCKSTEP_ASSERT_OK(exact.AddOuterProducts(0, a.to(cuda_), b.to(cuda_)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor device, exact.Sums(0));
  const at::Tensor ref = at::mm(a.to(at::kDouble).t(), b.to(at::kDouble));
  EXPECT_TRUE(at::allclose(device, ref, 1e-12, 1e-30)) << "the device summed something else";
  LOCKSTEP_ASSERT_OK(exact.AddOuterProducts(0, -a, b));  // CPU tensors: the host's rounding
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor difference, exact.Sums(0));
  EXPECT_TRUE(AllZero(difference))
      << "max |device - host| " << difference.abs().max().item<double>();
}

TEST_F(ExactGradientsCudaTest, BFloat16FactorsAndBlocksOfEveryShapeRoundAsTheHost) {
  // Tokens, rows and columns off the kernel's tiles, and a token split over blocks.
  for (const auto& [tokens, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 1}, {33, 31, 65}, {2049, 5, 3}, {64, 96, 130}}) {
    const at::Tensor a = WideRange({tokens, n}, 3).to(at::kBFloat16);
    const at::Tensor b = WideRange({tokens, k}, 4).to(at::kBFloat16);
    const at::Tensor w = at::zeros({n, k}, cuda_).requires_grad_(true);
    ExactGradients exact({{"w", w}});
    LOCKSTEP_ASSERT_OK(exact.AddOuterProducts(0, a.to(cuda_), b.to(cuda_)));
    LOCKSTEP_ASSERT_OK(exact.AddOuterProducts(0, -a, b));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor difference, exact.Sums(0));
    EXPECT_TRUE(AllZero(difference)) << tokens << " x " << n << " x " << k;
  }
}

TEST_F(ExactGradientsCudaTest, RowsAndColumnsOnTheDeviceRoundAsTheHost) {
  const at::Tensor ids = at::randint(0, 9, {200}, at::detail::createCPUGenerator(5));
  const at::Tensor values = WideRange({200, 11}, 6).to(at::kDouble) * (1.0 / 3.0);
  const at::Tensor embedding = at::zeros({9, 11}, cuda_).requires_grad_(true);
  const at::Tensor scale = at::zeros({11}, cuda_).requires_grad_(true);
  ExactGradients exact({{"embedding", embedding}, {"scale", scale}});
  LOCKSTEP_ASSERT_OK(exact.AddRows(0, ids.to(cuda_), values.to(cuda_)));
  LOCKSTEP_ASSERT_OK(exact.AddColumns(1, values.to(cuda_)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor rows, exact.Sums(0));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor columns, exact.Sums(1));
  EXPECT_TRUE(
      at::allclose(rows, at::zeros({9, 11}, at::kDouble).index_add_(0, ids, values), 1e-12, 1e-30));
  EXPECT_TRUE(at::allclose(columns, values.sum(0), 1e-12, 1e-30));
  LOCKSTEP_ASSERT_OK(exact.AddRows(0, ids, -values));
  LOCKSTEP_ASSERT_OK(exact.AddColumns(1, -values));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor row_difference, exact.Sums(0));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor column_difference, exact.Sums(1));
  EXPECT_TRUE(AllZero(row_difference));
  EXPECT_TRUE(AllZero(column_difference));
}

TEST_F(ExactGradientsCudaTest, TheWrittenGradientIsTheSameBitsInEveryGroupingAndOnTheHost) {
  const at::Tensor a = at::randn({500, 24}) * 1e2, b = at::randn({500, 40}) * 1e-4;
  auto written = [&](at::Device where, std::vector<int64_t> cuts) {
    const at::Tensor w = at::zeros({24, 40}, where).requires_grad_(true);
    ExactGradients exact({{"w", w}});
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      const int64_t n = cuts[i + 1] - cuts[i];
      EXPECT_TRUE(exact
                      .AddOuterProducts(0, a.narrow(0, cuts[i], n).to(where),
                                        b.narrow(0, cuts[i], n).to(where))
                      .ok());
    }
    EXPECT_TRUE(exact.WriteGradients().ok());
    return w.grad().to(at::kCPU);
  };
  const at::Tensor host = written(at::kCPU, {0, 500});
  EXPECT_TRUE(at::equal(written(cuda_, {0, 500}), host));
  EXPECT_TRUE(at::equal(written(cuda_, {0, 1, 77, 78, 300, 500}), host));
}

// The device's rounding of the 128-bit sums to float64 (written gradients, Sums) is the host's.
TEST_F(ExactGradientsCudaTest, SumsAndWrittenGradientsRoundAsTheHosts) {
  const at::Tensor a = WideRange({400, 21}, 7), b = WideRange({400, 19}, 8);
  auto run = [&](at::Device where) {
    const at::Tensor w =
        at::zeros({21, 19}, at::TensorOptions(where).dtype(at::kDouble)).requires_grad_(true);
    ExactGradients exact({{"w", w}});
    EXPECT_TRUE(exact.AddOuterProducts(0, a.to(where), b.to(where)).ok());
    absl::StatusOr<at::Tensor> sums = exact.Sums(0);
    EXPECT_TRUE(sums.ok()) << sums.status();
    EXPECT_TRUE(exact.WriteGradients().ok());
    return std::make_pair(*sums, w.grad().to(at::kCPU));
  };
  const auto [host_sums, host_grad] = run(at::kCPU);
  const auto [device_sums, device_grad] = run(cuda_);
  EXPECT_TRUE(at::equal(device_sums, host_sums));
  EXPECT_TRUE(at::equal(device_grad, host_grad));
  EXPECT_FALSE(AllZero(host_grad));
}

// SumOver a group: a CUDA parameter's limbs are made and taken on the device, a CPU parameter's
// on the host, in one reduction; the result is one member's deposit of every token.
TEST_F(ExactGradientsCudaTest, SumOverAGroupGivesOneMembersSumOfEveryToken) {
  const at::Tensor a = WideRange({64, 9}, 9), b = WideRange({64, 13}, 10);
  const at::Tensor columns = WideRange({64, 5}, 11).to(at::kDouble);
  auto whole = [&]() {
    const at::Tensor w = at::zeros({9, 13}).requires_grad_(true);
    const at::Tensor v = at::zeros({5}).requires_grad_(true);
    ExactGradients exact({{"w", w}, {"v", v}});
    EXPECT_TRUE(exact.AddOuterProducts(0, a, b).ok());
    EXPECT_TRUE(exact.AddColumns(1, columns).ok());
    return std::make_pair(*exact.Sums(0), *exact.Sums(1));
  }();
  collectives::FakeWorld world(2);
  std::vector<std::pair<at::Tensor, at::Tensor>> results(2);
  const std::vector<absl::Status> statuses = world.Run([&](collectives::Communicator& group) {
    const int rank = group.rank();
    const at::Tensor w = at::zeros({9, 13}, cuda_).requires_grad_(true);
    const at::Tensor v = at::zeros({5}).requires_grad_(true);
    ExactGradients exact({{"w", w}, {"v", v}});
    const at::Tensor half = at::arange(rank, 64, 2);
    LOCKSTEP_RETURN_IF_ERROR(exact.AddOuterProducts(0, a.index_select(0, half).to(cuda_),
                                                    b.index_select(0, half).to(cuda_)));
    LOCKSTEP_RETURN_IF_ERROR(exact.AddColumns(1, columns.index_select(0, half)));
    LOCKSTEP_RETURN_IF_ERROR(exact.SumOver(&group));
    LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor w_sums, exact.Sums(0));
    LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor v_sums, exact.Sums(1));
    results[rank] = {w_sums, v_sums};
    return absl::OkStatus();
  });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(statuses[rank].ok()) << statuses[rank];
    EXPECT_TRUE(at::equal(results[rank].first, whole.first)) << "rank " << rank;
    EXPECT_TRUE(at::equal(results[rank].second, whole.second)) << "rank " << rank;
  }
}

TEST_F(ExactGradientsCudaTest, ARefusalOnTheDeviceAddsNothing) {
  const at::Tensor a = at::randn({8, 3}), b = at::randn({8, 4});
  const at::Tensor w = at::zeros({3, 4}, cuda_).requires_grad_(true);
  ExactGradients exact({{"w", w}});
  LOCKSTEP_ASSERT_OK(exact.AddOuterProducts(0, a.to(cuda_), b.to(cuda_)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor before, exact.Sums(0));

  at::Tensor huge = a.clone();
  huge[5][1] = std::ldexp(1.0f, 30);
  const absl::Status too_large = exact.AddOuterProducts(0, huge.to(cuda_), b.to(cuda_));
  EXPECT_EQ(too_large.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(too_large.message(), HasSubstr("not below 2^24"));
  at::Tensor nan = a.clone();
  nan[2][0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(exact.AddOuterProducts(0, nan.to(cuda_), b.to(cuda_)).code(),
            absl::StatusCode::kOutOfRange);

  const at::Tensor embedding = at::zeros({4, 4}, cuda_).requires_grad_(true);
  ExactGradients rows({{"embedding", embedding}});
  const absl::Status outside =
      rows.AddRows(0, at::tensor({1, 4}, at::kLong).to(cuda_), b.narrow(0, 0, 2).to(cuda_));
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outside.message(), HasSubstr("row 4 outside [0, 4)"));

  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor after, exact.Sums(0));
  EXPECT_TRUE(at::equal(after, before));
}

}  // namespace
}  // namespace invariant
}  // namespace lockstep
