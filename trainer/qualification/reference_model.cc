#include "trainer/qualification/reference_model.h"

#include <limits>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "rng/philox.h"

namespace lockstep {
namespace trainer {
namespace {

// Positions per sequence in the dropout's global index space: row = id * kPositions + position.
constexpr int64_t kPositions = int64_t{1} << 20;
constexpr uint64_t kDropoutStream = 7;

}  // namespace

absl::StatusOr<ReferenceModel> ReferenceModel::Create(int tp_rank, int tp_size,
                                                      collectives::Communicator* tp_group,
                                                      c10::Device device) {
  if (tp_size < 1 || kHidden % tp_size != 0 || tp_rank < 0 || tp_rank >= tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("reference model: TP rank ", tp_rank, " of ",
                                                   tp_size, " does not split ", kHidden,
                                                   " hidden units evenly"));
  }
  if ((tp_size > 1) != (tp_group != nullptr)) {
    return absl::InvalidArgumentError("reference model: a TP group is needed exactly when TP > 1");
  }
  const int64_t shard = kHidden / tp_size, begin = tp_rank * shard;
  at::Tensor w1, w2;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("creating the reference model", [&] {
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    at::Tensor i = at::arange(kHidden, f32).unsqueeze(1), j = at::arange(kWidth, f32).unsqueeze(0);
    at::Tensor full_w1 = 0.3 * at::sin(1.7 * i + 0.9 * j + 0.1);           // [hidden, width]
    at::Tensor full_w2 = 0.25 * at::cos(0.8 * j.t() - 1.1 * i.t() + 0.3);  // [width, hidden]
    w1 = full_w1.slice(0, begin, begin + shard).to(device).clone().set_requires_grad(true);
    w2 = full_w2.slice(1, begin, begin + shard).to(device).clone().set_requires_grad(true);
  }));
  return ReferenceModel(std::move(w1), std::move(w2), begin, tp_group);
}

absl::StatusOr<at::Tensor> ReferenceModel::Forward(const ShardWork& work) {
  at::Tensor seed_tensor, h;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("reference forward", [&] {
    // The dropout seed, from the model stream (the same on every replica and in the reference).
    seed_tensor = at::randint(std::numeric_limits<int32_t>::max(), {2},
                              at::TensorOptions().dtype(at::kLong).device(w1_.device()))
                      .cpu();
    h = at::gelu(at::mm(work.inputs.to(at::kFloat), w1_.t()));
  }));
  const int64_t n = h.size(0);
  const uint64_t seed = static_cast<uint64_t>(seed_tensor[0].item<int64_t>()) << 31 |
                        static_cast<uint64_t>(seed_tensor[1].item<int64_t>());
  rng::PhiloxKey key;
  key.seed = seed;
  key.stream = kDropoutStream;
  key.step = 0;
  // Dropout mask, one contiguous run of positions of one sequence at a time.
  std::vector<at::Tensor> masks;
  const auto ids = work.sequence_ids.accessor<int64_t, 1>();
  const auto positions = work.positions.accessor<int64_t, 1>();
  // One global index space for every split: sequence ids below 2^20.
  const std::vector<int64_t> global_shape = {(int64_t{1} << 20) * kPositions, kHidden};
  for (int64_t t = 0; t < n; ++t) {
    if (ids[t] < 0 || ids[t] >= (int64_t{1} << 20) || positions[t] >= kPositions) {
      return absl::InvalidArgumentError(absl::StrCat("reference model: sequence id ", ids[t],
                                                     " or position ", positions[t],
                                                     " outside its dropout index space"));
    }
  }
  for (int64_t t = 0; t < n;) {
    int64_t end = t + 1;
    while (end < n && ids[end] == ids[t] && positions[end] == positions[end - 1] + 1) ++end;
    const int64_t row = ids[t] * kPositions + positions[t];
    const std::vector<rng::Slice> box = {{row, row + (end - t)}, {hidden_begin(), hidden_end()}};
    LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor mask, rng::PartitionedDropoutMask(key, global_shape, box,
                                                                           kDropout, w1_.device()));
    masks.push_back(mask);
    t = end;
  }
  at::Tensor out;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("reference forward", [&] {
    at::Tensor mask =
        n > 0 ? at::cat(masks) : at::zeros({0, w1_.size(0)}, w1_.options().dtype(at::kBool));
    at::Tensor dropped = h * mask.to(h.dtype()) * (1.0 / (1.0 - kDropout));
    out = at::mm(dropped, w2_.t());
  }));
  if (tp_group_ != nullptr) {
    // Differentiable all-reduce: the value of the sum, the gradient of the identity.
    at::Tensor sum;
    LOCKSTEP_RETURN_IF_ERROR(
        CallTorch("copying the partial sums", [&] { sum = out.detach().clone(); }));
    LOCKSTEP_RETURN_IF_ERROR(tp_group_->AllReduceSum(sum));
    LOCKSTEP_RETURN_IF_ERROR(
        CallTorch("reference residual", [&] { out = out + (sum - out.detach()); }));
  }
  LOCKSTEP_RETURN_IF_ERROR(
      CallTorch("reference residual", [&] { out = out + work.inputs.to(at::kFloat); }));
  return out;
}

}  // namespace trainer
}  // namespace lockstep
