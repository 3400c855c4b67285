#include "numerics/shuffled_sum.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "ATen/ATen.h"
#include "torch/csrc/jit/runtime/operator.h"
#include "torch/library.h"

namespace lockstep {
namespace numerics {
namespace controls {
namespace {

at::Tensor ShuffledSumKernel(const at::Tensor& terms) {
  TORCH_CHECK(terms.dim() == 2 && terms.scalar_type() == at::kFloat,
              "shuffled_sum: expected a float [k, m] tensor");
  const at::Tensor t = terms.contiguous();
  const int64_t k = t.size(0), m = t.size(1);
  std::vector<int64_t> order(k);
  std::iota(order.begin(), order.end(), 0);
  std::random_device entropy;
  std::mt19937_64 shuffle(static_cast<uint64_t>(entropy()) << 32 | entropy());
  std::shuffle(order.begin(), order.end(), shuffle);
  at::Tensor sum = at::empty({m}, t.options());
  const auto term = t.accessor<float, 2>();
  auto total = sum.accessor<float, 1>();
  for (int64_t i = 0; i < m; ++i) {
    float acc = 0;
    for (int64_t row : order) acc += term[row][i];
    total[i] = acc;
  }
  return sum;
}

}  // namespace

TORCH_LIBRARY(lockstep_controls, m) { m.def("shuffled_sum(Tensor terms) -> Tensor"); }

TORCH_LIBRARY_IMPL(lockstep_controls, CPU, m) { m.impl("shuffled_sum", &ShuffledSumKernel); }

// Called through the JIT's operator registry rather than an inline typed dispatcher call: the
// dispatcher's inline path reads a thread-local of libc10 that the GPU SDK's link stubs declare
// as an ordinary variable, which the linker refuses (tools/gpu_bundle.sh).
at::Tensor ShuffledSum(const at::Tensor& terms) {
  static const std::shared_ptr<torch::jit::Operator> op =
      torch::jit::findOperatorFor(c10::OperatorName(kShuffledSumOperator, ""));
  TORCH_CHECK(op != nullptr, kShuffledSumOperator, " is not registered");
  torch::jit::Stack stack{terms};
  op->getOperation()(stack);
  return stack.back().toTensor();
}

at::Tensor CancellingTerms(const at::Tensor& values, int64_t half) {
  const at::Tensor flat = values.reshape({-1}).to(at::kFloat);
  const at::Tensor s = 1e3 * at::sin(at::arange(half, flat.options()) * 0.7 + 0.1);
  return at::cat({s, -s}).unsqueeze(1) * flat.unsqueeze(0);
}

// Note [Deliberate nondeterminism]
// The negative control of the variability checks needs a module that computes different bits
// from the same inputs, as real nondeterminism does, and does so on every run, so that the
// check's verdict under the control is itself reproducible. The broken module adds to its output
// the rounding residue of a sum whose exact value is 0: 2R copies of each element scaled by
// +s_k and -s_k (large, varied s_k), reduced into one slot per element. Which residue comes out
// depends only on the order of the additions:
//   on a CUDA device, index_add_ with deterministic algorithms switched off around it: floating-
//     point atomics, in the order the scheduler picks (the H200's real hazard);
//   on the CPU, lockstep_controls::shuffled_sum (numerics/shuffled_sum.h): a sequential float
//     sum over the copies in an order drawn from std::random_device on every call, a reduction
//     whose order differs between passes and between actors, as a thread count or a
//     work-stealing schedule makes it differ.
at::Tensor RoundingResidue(const at::Tensor& output) {
  const at::Tensor flat = output.detach().reshape({-1});
  const int64_t half = flat.is_cuda() ? 1024 : 32;
  const at::Tensor s = 1e3 * at::sin(at::arange(half, flat.options()) * 0.7 + 0.1);
  const at::Tensor copies = at::cat({s, -s}).unsqueeze(1) * flat.unsqueeze(0);  // [2R, m]
  at::Tensor sum;
  if (flat.is_cuda()) {
    // Deterministic algorithms off for this op only, back on however it ends.
    struct Restore {
      bool deterministic = at::globalContext().deterministicAlgorithms();
      bool warn_only = at::globalContext().deterministicAlgorithmsWarnOnly();
      ~Restore() { at::globalContext().setDeterministicAlgorithms(deterministic, warn_only); }
    } restore;
    at::globalContext().setDeterministicAlgorithms(false, false);
    const at::Tensor slots =
        at::arange(flat.numel(), flat.options().dtype(at::kLong)).repeat({2 * half});
    sum = at::zeros_like(flat).index_add_(0, slots, copies.reshape({-1}));
  } else {
    // A loop of float additions (LibTorch's CPU reductions accumulate floats in double, which
    // would round the residue away), as a dispatcher operator: the operator recorder names it.
    sum = ShuffledSum(copies.to(at::kFloat).contiguous());
    sum = sum.to(flat.dtype());
  }
  return sum.reshape(output.sizes());
}

}  // namespace controls
}  // namespace numerics
}  // namespace lockstep
