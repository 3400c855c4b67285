#include "invariant/exact_gradients.h"

#include <cmath>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "invariant/ops.h"
#include "torch/torch.h"

namespace lockstep {
namespace invariant {
namespace {

using ::testing::HasSubstr;

at::Tensor Random(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::randn(shape, g);
}

// The gradient of w [5, 7] from a [100, 5] and b [100, 7], deposited in `groups` of rows (in
// the order given), then written.
at::Tensor Deposited(const at::Tensor& a, const at::Tensor& b,
                     const std::vector<std::pair<int64_t, int64_t>>& groups) {
  at::Tensor w = at::zeros({5, 7}).requires_grad_(true);
  ExactGradients exact({{"w", w}});
  for (const auto& [begin, end] : groups) {
    EXPECT_TRUE(exact.AddOuterProducts(0, a.slice(0, begin, end), b.slice(0, begin, end)).ok());
  }
  EXPECT_TRUE(exact.WriteGradients().ok());
  return w.grad().clone();
}

TEST(ExactGradientsTest, TheSumIsTheSameBitsInEveryGroupingAndOrder) {
  const at::Tensor a = Random({100, 5}, 1) * 1e3, b = Random({100, 7}, 2) * 1e-3;
  const at::Tensor whole = Deposited(a, b, {{0, 100}});
  std::vector<std::pair<int64_t, int64_t>> tokens, chunks, reversed;
  for (int64_t t = 0; t < 100; ++t) tokens.emplace_back(t, t + 1);
  for (int64_t t = 0; t < 100; t += 13) chunks.emplace_back(t, std::min<int64_t>(t + 13, 100));
  for (int64_t t = 99; t >= 0; --t) reversed.emplace_back(t, t + 1);
  EXPECT_TRUE(at::equal(Deposited(a, b, tokens), whole));
  EXPECT_TRUE(at::equal(Deposited(a, b, chunks), whole));
  EXPECT_TRUE(at::equal(Deposited(a, b, reversed), whole));
  // Within one rounding of the float64 sum (whose own error is far below it here).
  const at::Tensor ref = at::mm(a.to(at::kDouble).t(), b.to(at::kDouble));
  EXPECT_TRUE((whole.to(at::kDouble) - ref)
                  .abs()
                  .le(ref.abs() * std::ldexp(1.0, -23) + 1e-20)
                  .all()
                  .item<bool>());
}

// Note [Products as integers]: float32 factors take the integer path, float64 ones the float64
// path; the products are the same numbers, so the sums are the same bits, for magnitudes whose
// products round (far below 2^-80) and whose products are exact.
TEST(ExactGradientsTest, TheIntegerPathGivesTheFloat64PathsBits) {
  for (double scale : {1.0, 1e-12, 1e-22, 3e3}) {
    const at::Tensor a = Random({50, 5}, 8) * scale, b = Random({50, 7}, 9) * 1e-9;
    const at::Tensor fast = Deposited(a, b, {{0, 50}});
    const at::Tensor w = at::zeros({5, 7}).requires_grad_(true);
    ExactGradients exact({{"w", w}});
    ASSERT_TRUE(exact.AddOuterProducts(0, a.to(at::kDouble), b.to(at::kDouble)).ok());
    ASSERT_TRUE(exact.WriteGradients().ok());
    EXPECT_TRUE(at::equal(w.grad(), fast)) << "scale " << scale;
  }
}

TEST(ExactGradientsTest, LinearsWeightGradientDoesNotDependOnHowItsRowsWereCalled) {
  const at::Tensor x = Random({40, 6}, 3), dy = Random({40, 4}, 4);
  auto gradient = [&](std::vector<int64_t> cuts) {
    const at::Tensor w = Random({4, 6}, 5).requires_grad_(true);
    ExactGradients exact({{"w", w}});
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      const int64_t n = cuts[i + 1] - cuts[i];
      absl::StatusOr<at::Tensor> out = Linear(x.narrow(0, cuts[i], n), w, {&exact, 0});
      EXPECT_TRUE(out.ok()) << out.status();
      out->backward(dy.narrow(0, cuts[i], n));
    }
    EXPECT_FALSE(w.grad().defined()) << "the gradient went to autograd's .grad";
    EXPECT_TRUE(exact.WriteGradients().ok());
    return w.grad().clone();
  };
  const at::Tensor whole = gradient({0, 40});
  EXPECT_TRUE(at::equal(gradient({0, 1, 17, 18, 40}), whole));
  EXPECT_TRUE(at::equal(gradient({0, 20, 40}), whole));
  const at::Tensor ref = at::mm(dy.to(at::kDouble).t(), x.to(at::kDouble));
  EXPECT_TRUE(at::allclose(whole.to(at::kDouble), ref, 1e-6, 1e-12));
}

TEST(ExactGradientsTest, EmbeddingRowsAreSummedExactly) {
  const at::Tensor ids = at::tensor({3, 1, 3, 3, 0, 1}, at::kLong);
  const at::Tensor dy = Random({6, 4}, 6);
  auto gradient = [&](std::vector<int64_t> cuts) {
    const at::Tensor weight = Random({5, 4}, 7).requires_grad_(true);
    ExactGradients exact({{"embedding", weight}});
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      const int64_t n = cuts[i + 1] - cuts[i];
      absl::StatusOr<at::Tensor> out = Embedding(weight, ids.narrow(0, cuts[i], n), {&exact, 0});
      EXPECT_TRUE(out.ok()) << out.status();
      out->backward(dy.narrow(0, cuts[i], n));
    }
    EXPECT_TRUE(exact.WriteGradients().ok());
    return weight.grad().clone();
  };
  const at::Tensor whole = gradient({0, 6});
  EXPECT_TRUE(at::equal(gradient({0, 2, 3, 6}), whole));
  const at::Tensor ref = at::zeros({5, 4}, at::kDouble).index_add_(0, ids, dy.to(at::kDouble));
  EXPECT_TRUE(at::allclose(whole.to(at::kDouble), ref, 1e-6, 1e-12));
  EXPECT_TRUE(at::equal(whole[2], at::zeros({4})));
}

TEST(ExactGradientsTest, ColumnsAreSummedExactlyAndReadWithoutWriting) {
  // 1 + 2^-60 - 1: a float64 sum in this order loses the 2^-60; the exact sum keeps it.
  const at::Tensor values =
      at::tensor({1.0, 2.0, std::ldexp(1.0, -60), 0.0, -1.0, -2.0}, at::kDouble).view({3, 2});
  const at::Tensor scale = at::zeros({2}).requires_grad_(true);
  ExactGradients exact({{"norm.weight", scale}});
  ASSERT_TRUE(exact.AddColumns(0, values).ok());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor sums, exact.Sums(0));
  EXPECT_TRUE(at::equal(sums, at::tensor({std::ldexp(1.0, -60), 0.0}, at::kDouble)));
  EXPECT_FALSE(scale.grad().defined());
  // Read again: still there, until written.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor again, exact.Sums(0));
  EXPECT_TRUE(at::equal(again, sums));
  EXPECT_THAT(exact.AddColumns(0, at::ones({2, 3})).message(), HasSubstr("do not fit"));
  // A refused call adds nothing.
  EXPECT_EQ(exact.AddColumns(0, at::tensor({1.0, NAN}).view({1, 2})).code(),
            absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(exact.WriteGradients().ok());
  EXPECT_TRUE(at::equal(scale.grad(), at::tensor({static_cast<float>(std::ldexp(1.0, -60)), 0.f})));
}

TEST(ExactGradientsTest, RefusesWhatItCannotHoldExactly) {
  const at::Tensor w = at::zeros({2, 2}).requires_grad_(true);
  ExactGradients exact({{"layer.w", w}});
  const absl::Status large =
      exact.AddOuterProducts(0, at::full({1, 2}, 1e4), at::full({1, 2}, 1e4));
  EXPECT_EQ(large.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(large.message(), HasSubstr("'layer.w': contribution 1e+08"));
  EXPECT_THAT(large.message(), HasSubstr("not below 2^24"));
  const absl::Status nan = exact.AddOuterProducts(0, at::full({1, 2}, NAN), at::ones({1, 2}));
  EXPECT_EQ(nan.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(exact.AddOuterProducts(0, at::ones({1, 3}), at::ones({1, 2})).code(),
            absl::StatusCode::kInvalidArgument);
  // A refused call adds nothing, not even the rows before the bad one.
  EXPECT_THAT(exact.AddRows(0, at::tensor({0, 1, 2}, at::kLong), at::ones({3, 2})).message(),
              HasSubstr("row 2 outside [0, 2)"));
  exact.Zero();
  EXPECT_EQ(exact.AddRows(0, at::tensor({0, 5}, at::kLong), at::ones({2, 2})).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(exact.WriteGradients().ok());
  EXPECT_TRUE(at::equal(w.grad(), at::zeros({2, 2})));
  EXPECT_EQ(exact.SlotOf("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Linear(at::ones({1, 2}), w, {&exact, -1}).status().message(),
              HasSubstr("exact gradients without a slot"));
}

// A step's loss: the same bits whatever the grouping of its terms, within one rounding of the
// float64 sum; a term it cannot hold is refused and adds nothing.
TEST(ExactSumTest, TheTotalIsTheSameBitsInEveryGroupingAndRefusalsAddNothing) {
  const at::Tensor terms = Random({97}, 12).abs() * 3.7;
  auto total = [&](std::vector<int64_t> cuts) {
    absl::StatusOr<ExactSum> sum = ExactSum::Make();
    EXPECT_TRUE(sum.ok()) << sum.status();
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      EXPECT_TRUE(sum->Add(terms.narrow(0, cuts[i], cuts[i + 1] - cuts[i]).view({-1, 1})).ok());
    }
    EXPECT_TRUE(sum->SumOver(nullptr).ok());
    absl::StatusOr<double> value = sum->Total();
    EXPECT_TRUE(value.ok()) << value.status();
    return *value;
  };
  const double whole = total({0, 97});
  EXPECT_EQ(total({0, 1, 50, 96, 97}), whole);
  EXPECT_EQ(total({0, 30, 60, 97}), whole);
  EXPECT_NEAR(whole, terms.to(at::kDouble).sum().item<double>(), std::abs(whole) * 1e-15);

  absl::StatusOr<ExactSum> sum = ExactSum::Make();
  ASSERT_TRUE(sum.ok());
  ASSERT_TRUE(sum->Add(at::tensor({1.5, 2.25}, at::kDouble)).ok());
  const absl::Status refused = sum->Add(at::tensor({1.0, std::ldexp(1.0, 30)}, at::kDouble));
  EXPECT_EQ(refused.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(refused.message(), HasSubstr("not below 2^24"));
  EXPECT_EQ(*sum->Total(), 3.75);
  sum->Zero();
  EXPECT_EQ(*sum->Total(), 0.0);
}

}  // namespace
}  // namespace invariant
}  // namespace lockstep
