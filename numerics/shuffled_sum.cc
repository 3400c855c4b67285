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

}  // namespace controls
}  // namespace numerics
}  // namespace lockstep
