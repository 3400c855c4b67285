// invariant/ops.h's kernels against float64 references and against themselves across
// placements. Built twice: //invariant:ops_test on the CPU and, with LOCKSTEP_INVARIANT_ON_CUDA,
// //invariant:ops_cuda_test (gpu) with every tensor on CUDA device 0.

#include "invariant/ops.h"

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "invariant/mode.h"
#include "torch/torch.h"

namespace lockstep {
namespace invariant {
namespace {

using ::testing::HasSubstr;

#ifdef LOCKSTEP_INVARIANT_ON_CUDA
const c10::Device kDevice(c10::kCUDA, 0);
#else
const c10::Device kDevice(c10::kCPU);
#endif

at::Tensor Random(std::vector<int64_t> shape, uint64_t seed, at::ScalarType type = at::kFloat) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::randn(shape, g, at::TensorOptions().dtype(at::kFloat)).to(type).to(kDevice);
}

// [n, 2] tokens of one sequence: id, positions first..first + n - 1.
at::Tensor Tokens(int64_t id, int64_t n, int64_t first = 0) {
  at::Tensor t = at::empty({n, 2}, at::kLong);
  for (int64_t i = 0; i < n; ++i) {
    t[i][0] = id;
    t[i][1] = first + i;
  }
  return t;
}

TEST(LinearTest, MatchesTheFloat64ProductWithinOneRounding) {
  const at::Tensor x = Random({37, 53}, 1), w = Random({29, 53}, 2);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor out, Linear(x, w));
  ASSERT_EQ(out.scalar_type(), at::kFloat);
  const at::Tensor ref = at::mm(x.to(at::kDouble), w.to(at::kDouble).t());
  const at::Tensor magnitude = at::mm(x.abs().to(at::kDouble), w.abs().to(at::kDouble).t());
  // One float32 rounding of the result, plus float64 sums' error.
  const at::Tensor bound = ref.abs() * std::ldexp(1.0, -24) + magnitude * std::ldexp(1.0, -45);
  EXPECT_TRUE((out.to(at::kDouble) - ref).abs().le(bound).all().item<bool>());
}

// In float64 too, where the order of the float64 sums shows in the result's bits (in float32 a
// different order seldom survives the final rounding).
TEST(LinearTest, ARowsBitsDoNotDependOnTheOtherRowsOfTheCall) {
  for (at::ScalarType type : {at::kFloat, at::kDouble}) {
    const at::Tensor x = Random({12, 40}, 3, type), w = Random({24, 40}, 4, type);
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor alone, Linear(x, w));
    for (int64_t others : {1, 5, 63, 200}) {
      // x's rows reversed, after `others` unrelated rows.
      const at::Tensor packed = at::cat({Random({others, 40}, 10 + others, type), x.flip(0)});
      LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor out, Linear(packed, w));
      EXPECT_TRUE(at::equal(out.narrow(0, others, 12).flip(0), alone)) << others << " other rows";
    }
    for (int64_t r = 0; r < 12; ++r) {
      LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor one, Linear(x.narrow(0, r, 1), w));
      EXPECT_TRUE(at::equal(one[0], alone[r])) << "row " << r << " alone, " << type;
    }
  }
}

TEST(LinearTest, BFloat16IsRoundedOnceAndRowInvariant) {
  const at::Tensor x = Random({9, 64}, 5, at::kBFloat16), w = Random({16, 64}, 6, at::kBFloat16);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor out, Linear(x, w));
  ASSERT_EQ(out.scalar_type(), at::kBFloat16);
  const at::Tensor ref = at::mm(x.to(at::kDouble), w.to(at::kDouble).t());
  // Within one bfloat16 rounding (2^-8 relative), from float64 through float32.
  EXPECT_TRUE((out.to(at::kDouble) - ref)
                  .abs()
                  .le(ref.abs() * std::ldexp(1.0, -8) + 1e-30)
                  .all()
                  .item<bool>());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor last, Linear(x.narrow(0, 8, 1), w));
  EXPECT_TRUE(at::equal(last[0], out[8]));
}

TEST(LinearTest, GradientsMatchAutogradOfTheFloat64Product) {
  const at::Tensor x = Random({7, 11}, 7, at::kDouble).requires_grad_(true);
  const at::Tensor w = Random({5, 11}, 8, at::kDouble).requires_grad_(true);
  const at::Tensor dy = Random({7, 5}, 9, at::kDouble);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor out, Linear(x, w));
  const std::vector<at::Tensor> mine = torch::autograd::grad({out}, {x, w}, {dy});
  const at::Tensor ref = at::mm(x, w.t());
  const std::vector<at::Tensor> theirs = torch::autograd::grad({ref}, {x, w}, {dy});
  EXPECT_TRUE(at::allclose(mine[0], theirs[0], 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(mine[1], theirs[1], 1e-12, 1e-12));
}

TEST(LinearTest, RefusesWhatItCannotMultiply) {
  const at::Tensor x = Random({3, 4}, 1);
  EXPECT_THAT(Linear(x, Random({2, 5}, 2)).status().message(), HasSubstr("do not chain"));
  EXPECT_THAT(Linear(x, Random({2, 4}, 2, at::kDouble)).status().message(),
              HasSubstr("dtypes Float and Double differ"));
  EXPECT_EQ(Linear(x.to(at::kLong), x.to(at::kLong)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Linear(Random({3}, 1), x).status().message(), HasSubstr("a matrix"));
}

TEST(GeluTest, MatchesTheFloat64GeluAtEveryOffset) {
  const at::Tensor x = Random({1000}, 11) * 3;
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor out, Gelu(x));
  const at::Tensor ref = at::gelu(x.to(at::kDouble));
  EXPECT_TRUE((out.to(at::kDouble) - ref)
                  .abs()
                  .le(ref.abs() * std::ldexp(1.0, -24) + 1e-300)
                  .all()
                  .item<bool>());
  // The same element at every offset of a call (LibTorch's vectorized and scalar paths differ).
  for (int64_t offset : {1, 3, 7, 13}) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor shifted,
                                  Gelu(at::cat({Random({offset}, 12), x})));
    EXPECT_TRUE(at::equal(shifted.narrow(0, offset, 1000), out)) << "offset " << offset;
  }
}

TEST(GeluTest, GradientMatchesAutogradOfLibTorchsGelu) {
  const at::Tensor x = (Random({50}, 13, at::kDouble) * 2).requires_grad_(true);
  const at::Tensor dy = Random({50}, 14, at::kDouble);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor out, Gelu(x));
  const at::Tensor mine = torch::autograd::grad({out}, {x}, {dy})[0];
  const at::Tensor theirs = torch::autograd::grad({at::gelu(x)}, {x}, {dy})[0];
  EXPECT_TRUE(at::allclose(mine, theirs, 1e-12, 1e-12));
}

// The float64 reference: masked softmax attention over every key of the call.
at::Tensor ReferenceAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& qt, const at::Tensor& kt, double scale) {
  const at::Tensor visible = ((qt.select(1, 0).unsqueeze(1) == kt.select(1, 0).unsqueeze(0)) &
                              (kt.select(1, 1).unsqueeze(0) <= qt.select(1, 1).unsqueeze(1)) &
                              kt.select(1, 0).unsqueeze(0).ge(0))
                                 .to(q.device());
  const at::Tensor scores =
      (at::mm(q, k.t()) * scale)
          .masked_fill(at::logical_not(visible), -std::numeric_limits<double>::infinity());
  return at::mm(at::softmax(scores, 1), v);
}

struct Packed {
  at::Tensor q, k, v, qt, kt;
};

// Sequence A (5 tokens) alone, and packed: after sequence B (7 tokens), with A's keys shuffled
// among B's and two padding keys, as a CP gather leaves them.
struct TwoSequences {
  at::Tensor qa = Random({5, 8}, 21), ka = Random({5, 8}, 22), va = Random({5, 6}, 23);
  at::Tensor qb = Random({7, 8}, 24), kb = Random({7, 8}, 25), vb = Random({7, 6}, 26);
  Packed Alone() const { return {qa, ka, va, Tokens(3, 5), Tokens(3, 5)}; }
  Packed Together() const {
    const at::Tensor pad_k = Random({2, 8}, 27), pad_v = Random({2, 6}, 28);
    const at::Tensor pad_t = at::full({2, 2}, -1, at::kLong);
    const at::Tensor order = at::tensor({4, 0, 9, 1, 7, 13, 2, 5, 3, 6, 8, 10, 11, 12}, at::kLong);
    const at::Tensor k = at::cat({ka, kb, pad_k}).index_select(0, order.to(kDevice));
    const at::Tensor v = at::cat({va, vb, pad_v}).index_select(0, order.to(kDevice));
    const at::Tensor kt = at::cat({Tokens(3, 5), Tokens(9, 7), pad_t}).index_select(0, order);
    return {at::cat({qb, qa}), k, v, at::cat({Tokens(9, 7), Tokens(3, 5)}), kt};
  }
};

TEST(SequenceAttentionTest, MatchesTheFloat64Reference) {
  const TwoSequences s;
  const Packed p = s.Together();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor out,
                                SequenceAttention(p.q, p.k, p.v, p.qt, p.kt, 0.35));
  const at::Tensor ref = ReferenceAttention(p.q.to(at::kDouble), p.k.to(at::kDouble),
                                            p.v.to(at::kDouble), p.qt, p.kt, 0.35);
  EXPECT_TRUE(at::allclose(out.to(at::kDouble), ref, 1e-6, 1e-7));
}

TEST(SequenceAttentionTest, ASequencesOutputsAreTheSameBitsAlonePackedAndSharded) {
  const TwoSequences s;
  const Packed a = s.Alone(), p = s.Together();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor alone,
                                SequenceAttention(a.q, a.k, a.v, a.qt, a.kt, 0.35));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor packed,
                                SequenceAttention(p.q, p.k, p.v, p.qt, p.kt, 0.35));
  EXPECT_TRUE(at::equal(packed.narrow(0, 7, 5), alone));
  // A CP shard: A's last three queries, every key of the group.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      const at::Tensor shard,
      SequenceAttention(s.qa.narrow(0, 2, 3), p.k, p.v, Tokens(3, 3, 2), p.kt, 0.35));
  EXPECT_TRUE(at::equal(shard, alone.narrow(0, 2, 3)));
}

TEST(SequenceAttentionTest, GradientsMatchTheReferenceAndDoNotDependOnThePacking) {
  const TwoSequences s;
  auto grads = [](const Packed& p, const at::Tensor& dout, bool reference) {
    const at::Tensor q = p.q.to(at::kDouble).requires_grad_(true);
    const at::Tensor k = p.k.to(at::kDouble).requires_grad_(true);
    const at::Tensor v = p.v.to(at::kDouble).requires_grad_(true);
    at::Tensor out = reference ? ReferenceAttention(q, k, v, p.qt, p.kt, 0.35)
                               : *SequenceAttention(q, k, v, p.qt, p.kt, 0.35);
    return torch::autograd::grad({out}, {q, k, v}, {dout});
  };
  const Packed a = s.Alone(), p = s.Together();
  const at::Tensor dout_a = Random({5, 6}, 31, at::kDouble);
  const at::Tensor dout_p = at::cat({Random({7, 6}, 32, at::kDouble), dout_a});
  const std::vector<at::Tensor> mine = grads(p, dout_p, false);
  const std::vector<at::Tensor> theirs = grads(p, dout_p, true);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::allclose(mine[i], theirs[i], 1e-10, 1e-12)) << i;
  // A's rows of dq, and the gradients of A's keys and values, alone and packed.
  const std::vector<at::Tensor> alone = grads(a, dout_a, false);
  EXPECT_TRUE(at::equal(mine[0].narrow(0, 7, 5), alone[0]));
  const at::Tensor a_rows = (p.kt.select(1, 0) == 3).nonzero().squeeze(1).to(kDevice);
  const at::Tensor a_positions = p.kt.to(kDevice).index_select(0, a_rows).select(1, 1);
  EXPECT_TRUE(at::equal(mine[1].index_select(0, a_rows), alone[1].index_select(0, a_positions)));
  EXPECT_TRUE(at::equal(mine[2].index_select(0, a_rows), alone[2].index_select(0, a_positions)));
}

TEST(SequenceAttentionTest, RefusesAmbiguousOrUnseeingTokens) {
  const TwoSequences s;
  at::Tensor twice = Tokens(3, 5);
  twice[4][1] = 3;
  const absl::Status duplicate =
      SequenceAttention(s.qa, s.ka, s.va, Tokens(3, 5), twice, 1.0).status();
  EXPECT_EQ(duplicate.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(duplicate.message(), HasSubstr("are both sequence 3's position 3"));
  const absl::Status unseeing =
      SequenceAttention(s.qa, s.ka, s.va, Tokens(4, 5), Tokens(3, 5), 1.0).status();
  EXPECT_THAT(unseeing.message(), HasSubstr("query 0 (sequence 4, position 0) sees no key"));
  EXPECT_THAT(
      SequenceAttention(s.qa, s.ka, s.va, Tokens(3, 4), Tokens(3, 5), 1.0).status().message(),
      HasSubstr("query_tokens must be int64 [5, 2]"));
}

#ifdef LOCKSTEP_INVARIANT_ON_CUDA
// The GPU's Linear is the CPU's, bit for bit (the same float64 operations in the same order).
TEST(LinearTest, TheGpuGivesTheCpusBits) {
  for (at::ScalarType type : {at::kFloat, at::kDouble, at::kBFloat16}) {
    const at::Tensor x = Random({33, 70}, 41, type), w = Random({19, 70}, 42, type);
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor gpu, Linear(x, w));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor cpu, Linear(x.cpu(), w.cpu()));
    EXPECT_TRUE(at::equal(gpu.cpu(), cpu)) << type;
  }
}
#endif

TEST(LayerNormTest, MatchesTheFloat64LayerNorm) {
  const at::Tensor x = Random({37, 48}, 21) * 2 + 1, weight = Random({48}, 22),
                   bias = Random({48}, 23);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor out, LayerNorm(x, weight, bias));
  ASSERT_EQ(out.scalar_type(), at::kFloat);
  const at::Tensor ref =
      at::layer_norm(x.to(at::kDouble), {48}, weight.to(at::kDouble), bias.to(at::kDouble));
  // One float32 rounding of the result, plus the float64 steps' error.
  EXPECT_TRUE((out.to(at::kDouble) - ref)
                  .abs()
                  .le(ref.abs() * std::ldexp(1.0, -24) + 1e-12)
                  .all()
                  .item<bool>());
}

TEST(LayerNormTest, ARowsBitsDoNotDependOnTheOtherRowsOfTheCall) {
  for (at::ScalarType type : {at::kFloat, at::kDouble}) {
    const at::Tensor x = Random({10, 40}, 24, type), weight = Random({40}, 25, type),
                     bias = Random({40}, 26, type);
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor alone, LayerNorm(x, weight, bias));
    for (int64_t others : {1, 7, 130}) {
      const at::Tensor packed = at::cat({Random({others, 40}, 30 + others, type) * 5, x.flip(0)});
      LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor out, LayerNorm(packed, weight, bias));
      EXPECT_TRUE(at::equal(out.narrow(0, others, 10).flip(0), alone)) << others << " other rows";
    }
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor one, LayerNorm(x.narrow(0, 3, 1), weight, bias));
    EXPECT_TRUE(at::equal(one[0], alone[3])) << type;
  }
}

TEST(LayerNormTest, GradientsMatchAutogradOfTheFloat64LayerNorm) {
  const at::Tensor x = (Random({9, 13}, 27, at::kDouble) * 3).requires_grad_(true);
  const at::Tensor weight = Random({13}, 28, at::kDouble).requires_grad_(true);
  const at::Tensor bias = Random({13}, 29, at::kDouble).requires_grad_(true);
  const at::Tensor dy = Random({9, 13}, 30, at::kDouble);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor out, LayerNorm(x, weight, bias));
  const std::vector<at::Tensor> mine = torch::autograd::grad({out}, {x, weight, bias}, {dy});
  const at::Tensor ref = at::layer_norm(x, {13}, weight, bias);
  const std::vector<at::Tensor> theirs = torch::autograd::grad({ref}, {x, weight, bias}, {dy});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::allclose(mine[i], theirs[i], 1e-10, 1e-12)) << i;
}

// The weight's and bias's gradients summed exactly: the same bits however the rows were called.
TEST(LayerNormTest, ExactGradientsDoNotDependOnHowItsRowsWereCalled) {
  const at::Tensor x = Random({30, 8}, 31), dy = Random({30, 8}, 32);
  auto gradients = [&](std::vector<int64_t> cuts) {
    const at::Tensor weight = Random({8}, 33).requires_grad_(true);
    const at::Tensor bias = Random({8}, 34).requires_grad_(true);
    ExactGradients exact({{"weight", weight}, {"bias", bias}});
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      const int64_t n = cuts[i + 1] - cuts[i];
      absl::StatusOr<at::Tensor> out =
          LayerNorm(x.narrow(0, cuts[i], n), weight, bias, 1e-5, {&exact, 0}, {&exact, 1});
      EXPECT_TRUE(out.ok()) << out.status();
      out->backward(dy.narrow(0, cuts[i], n));
    }
    EXPECT_FALSE(weight.grad().defined()) << "the gradient went to autograd's .grad";
    EXPECT_TRUE(exact.WriteGradients().ok());
    return std::vector<at::Tensor>{weight.grad().clone(), bias.grad().clone()};
  };
  const std::vector<at::Tensor> whole = gradients({0, 30});
  for (const std::vector<int64_t>& cuts :
       std::vector<std::vector<int64_t>>{{0, 1, 2, 30}, {0, 11, 29, 30}}) {
    const std::vector<at::Tensor> split = gradients(cuts);
    EXPECT_TRUE(at::equal(split[0], whole[0]));
    EXPECT_TRUE(at::equal(split[1], whole[1]));
  }
  EXPECT_TRUE(at::allclose(whole[1].to(at::kDouble), dy.to(at::kDouble).sum(0), 1e-6, 1e-12));
}

TEST(LayerNormTest, RefusesWhatDoesNotFit) {
  const at::Tensor x = Random({3, 4}, 1);
  EXPECT_THAT(LayerNorm(x, Random({5}, 2), Random({4}, 3)).status().message(),
              HasSubstr("do not fit"));
  EXPECT_THAT(LayerNorm(x, Random({4}, 2), Random({4}, 3), 0).status().message(),
              HasSubstr("eps 0 is not positive"));
}

TEST(CrossEntropyTest, MatchesTheFloat64CrossEntropy) {
  const at::Tensor logits = Random({33, 50}, 41) * 3;
  const at::Tensor targets = at::randint(50, {33}, at::kLong).to(kDevice);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor out, CrossEntropy(logits, targets));
  ASSERT_EQ(out.scalar_type(), at::kFloat);
  const at::Tensor ref =
      at::cross_entropy_loss(logits.to(at::kDouble), targets, {}, at::Reduction::None);
  EXPECT_TRUE((out.to(at::kDouble) - ref)
                  .abs()
                  .le(ref.abs() * std::ldexp(1.0, -24) + 1e-12)
                  .all()
                  .item<bool>());
}

TEST(CrossEntropyTest, ARowsBitsAndGradientDoNotDependOnTheOtherRows) {
  const at::Tensor logits = Random({6, 70}, 42, at::kDouble) * 4;
  const at::Tensor targets = at::tensor({0, 69, 5, 5, 31, 2}, at::kLong).to(kDevice);
  const at::Tensor dnll = Random({6}, 43, at::kDouble);
  auto run = [&](const at::Tensor& z, const at::Tensor& t, const at::Tensor& d) {
    const at::Tensor leaf = z.clone().requires_grad_(true);
    absl::StatusOr<at::Tensor> out = CrossEntropy(leaf, t);
    EXPECT_TRUE(out.ok()) << out.status();
    out->backward(d);
    return std::make_pair(out->detach(), leaf.grad());
  };
  const auto [alone, grad] = run(logits, targets, dnll);
  const at::Tensor others = Random({40, 70}, 44, at::kDouble);
  const auto [packed, packed_grad] =
      run(at::cat({others, logits}), at::cat({at::zeros({40}, targets.options()), targets}),
          at::cat({at::ones({40}, dnll.options()), dnll}));
  EXPECT_TRUE(at::equal(packed.narrow(0, 40, 6), alone));
  EXPECT_TRUE(at::equal(packed_grad.narrow(0, 40, 6), grad));
  // And the gradient is the float64 reference's.
  const at::Tensor leaf = logits.clone().requires_grad_(true);
  at::cross_entropy_loss(leaf, targets, {}, at::Reduction::None).backward(dnll);
  EXPECT_TRUE(at::allclose(grad, leaf.grad(), 1e-12, 1e-14));
}

TEST(CrossEntropyTest, RefusesATargetOutsideTheClasses) {
  const at::Tensor logits = Random({2, 5}, 1);
  EXPECT_THAT(CrossEntropy(logits, at::tensor({0, 5}, at::kLong)).status().message(),
              HasSubstr("target 5 outside [0, 5)"));
  EXPECT_THAT(CrossEntropy(logits, at::tensor({0}, at::kLong)).status().message(),
              HasSubstr("targets must be int64 [2]"));
}

TEST(ModeTest, ScopesNestAndTheModeEndsWithTheLast) {
  EXPECT_FALSE(ModeOn());
  {
    PlacementInvariantScope outer;
    EXPECT_TRUE(ModeOn());
    {
      PlacementInvariantScope inner;
      EXPECT_TRUE(ModeOn());
    }
    EXPECT_TRUE(ModeOn());
  }
  EXPECT_FALSE(ModeOn());
}

}  // namespace
}  // namespace invariant
}  // namespace lockstep
