#include "numerics/shuffled_sum.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/core/dispatch/Dispatcher.h"
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

at::Tensor ShuffledSum(const at::Tensor& terms) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(kShuffledSumOperator, "")
                             .typed<at::Tensor(const at::Tensor&)>();
  return op.call(terms);
}

at::Tensor CancellingTerms(const at::Tensor& values, int64_t half) {
  const at::Tensor flat = values.reshape({-1}).to(at::kFloat);
  const at::Tensor s = 1e3 * at::sin(at::arange(half, flat.options()) * 0.7 + 0.1);
  return at::cat({s, -s}).unsqueeze(1) * flat.unsqueeze(0);
}

}  // namespace controls
}  // namespace numerics
}  // namespace lockstep
