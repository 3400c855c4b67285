#include "collectives/differentiable.h"

#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "torch/csrc/autograd/custom_function.h"

namespace lockstep {
namespace collectives {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Autograd keeps non-tensor arguments as IValues: the group travels as its address. The caller
// keeps the communicator alive until backward has run (the contract of a model's groups).
int64_t Handle(Communicator* group) { return reinterpret_cast<int64_t>(group); }
Communicator* GroupOf(AutogradContext* ctx) {
  return reinterpret_cast<Communicator*>(ctx->saved_data["group"].toInt());
}

void OrThrow(const absl::Status& status) {
  if (!status.ok()) ThrowAsTorchError(status);
}

at::Tensor SummedOver(Communicator* group, const at::Tensor& t, const char* what) {
  at::Tensor sum = t.contiguous().clone();
  OrThrow(Annotate(group->AllReduceSum(sum), what));
  return sum;
}

struct CopyToGroupFunction : torch::autograd::Function<CopyToGroupFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return x.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {SummedOver(GroupOf(ctx), grads[0], "in CopyToGroup's backward"), at::Tensor()};
  }
};

struct ReduceFromGroupFunction : torch::autograd::Function<ReduceFromGroupFunction> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, int64_t group) {
    return SummedOver(reinterpret_cast<Communicator*>(group), x, "in ReduceFromGroup's forward");
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

struct GatherRowsFunction : torch::autograd::Function<GatherRowsFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t widest,
                            int64_t group) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["rows"] = x.size(0);
    ctx->saved_data["widest"] = widest;
    std::vector<int64_t> shape = x.sizes().vec();
    shape[0] = widest;
    at::Tensor padded = at::zeros(shape, x.options());
    padded.narrow(0, 0, x.size(0)).copy_(x);
    absl::StatusOr<std::vector<at::Tensor>> all =
        reinterpret_cast<Communicator*>(group)->AllGather(padded);
    if (!all.ok()) ThrowAsTorchError(Annotate(all.status(), "in GatherRows' forward"));
    return at::cat(*all, 0);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Communicator* group = GroupOf(ctx);
    const at::Tensor sum = SummedOver(group, grads[0], "in GatherRows' backward");
    const int64_t widest = ctx->saved_data["widest"].toInt();
    const int64_t rows = ctx->saved_data["rows"].toInt();
    return {sum.narrow(0, group->rank() * widest, rows).clone(), at::Tensor(), at::Tensor()};
  }
};

struct ReduceScatterRowsFunction : torch::autograd::Function<ReduceScatterRowsFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t rows, int64_t widest,
                            int64_t group) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["widest"] = widest;
    Communicator* g = reinterpret_cast<Communicator*>(group);
    const at::Tensor sum = SummedOver(g, x, "in ReduceScatterRows' forward");
    return sum.narrow(0, g->rank() * widest, rows).clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Communicator* group = GroupOf(ctx);
    const int64_t widest = ctx->saved_data["widest"].toInt();
    std::vector<int64_t> shape = grads[0].sizes().vec();
    shape[0] = widest;
    at::Tensor padded = at::zeros(shape, grads[0].options());
    padded.narrow(0, 0, grads[0].size(0)).copy_(grads[0]);
    absl::StatusOr<std::vector<at::Tensor>> all = group->AllGather(padded);
    if (!all.ok()) ThrowAsTorchError(Annotate(all.status(), "in ReduceScatterRows' backward"));
    return {at::cat(*all, 0), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

absl::StatusOr<at::Tensor> CopyToGroup(const at::Tensor& x, Communicator* group) {
  if (group == nullptr) return x;
  return CallTorch("CopyToGroup", [&]() -> absl::StatusOr<at::Tensor> {
    return CopyToGroupFunction::apply(x, Handle(group));
  });
}

absl::StatusOr<at::Tensor> ReduceFromGroup(const at::Tensor& x, Communicator* group) {
  if (group == nullptr) return x;
  return CallTorch("ReduceFromGroup", [&]() -> absl::StatusOr<at::Tensor> {
    return ReduceFromGroupFunction::apply(x, Handle(group));
  });
}

absl::StatusOr<at::Tensor> GatherRows(const at::Tensor& x, int64_t widest, Communicator* group) {
  if (!x.defined() || x.dim() == 0) {
    return absl::InvalidArgumentError("GatherRows: the tensor needs a row dimension");
  }
  if (x.size(0) > widest) {
    return absl::InvalidArgumentError(
        absl::StrCat("GatherRows: ", x.size(0), " rows, more than the widest ", widest));
  }
  if (group == nullptr) return x;
  return CallTorch("GatherRows", [&]() -> absl::StatusOr<at::Tensor> {
    return GatherRowsFunction::apply(x, widest, Handle(group));
  });
}

}  // namespace collectives
}  // namespace lockstep

namespace lockstep {
namespace collectives {

absl::StatusOr<at::Tensor> ReduceScatterRows(const at::Tensor& x, int64_t rows, int64_t widest,
                                             Communicator* group) {
  const int64_t members = group == nullptr ? 1 : group->size();
  if (!x.defined() || x.dim() == 0 || x.size(0) != members * widest || rows > widest || rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReduceScatterRows: ", x.defined() && x.dim() > 0 ? x.size(0) : 0,
                     " rows for ", members, " members of ", widest, " rows each, keeping ", rows));
  }
  if (group == nullptr) return x.narrow(0, 0, rows);
  return CallTorch("ReduceScatterRows", [&]() -> absl::StatusOr<at::Tensor> {
    return ReduceScatterRowsFunction::apply(x, rows, widest, Handle(group));
  });
}

}  // namespace collectives
}  // namespace lockstep
