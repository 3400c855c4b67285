#include "invariant/ops.h"

#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/record_function.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "invariant/internal/cpu_kernels.h"
#include "invariant/internal/device_ops.h"
#include "torch/csrc/autograd/custom_function.h"

namespace lockstep {
namespace invariant {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor Wide(const at::Tensor& t) { return t.to(at::kDouble).contiguous(); }

std::string Shape(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

absl::Status CheckFloating(const char* op, const char* name, const at::Tensor& t) {
  if (!t.defined())
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is undefined"));
  const at::ScalarType type = t.scalar_type();
  if (type != at::kFloat && type != at::kDouble && type != at::kBFloat16 && type != at::kHalf) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is ", c10::toString(type),
                                                   "; float32, float64, bfloat16 or float16"));
  }
  if (!t.is_cpu() && !t.is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " is on ", t.device().str(), "; the CPU or a CUDA device"));
  }
  return absl::OkStatus();
}

absl::Status SameDevice(const char* op, const at::Tensor& a, const at::Tensor& b) {
  if (a.device() == b.device()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": tensors on ", a.device().str(), " and ", b.device().str()));
}

absl::Status CheckMatrix(const char* op, const char* name, const at::Tensor& t) {
  LOCKSTEP_RETURN_IF_ERROR(CheckFloating(op, name, t));
  if (t.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " is ", Shape(t), "; a matrix [rows, columns]"));
  }
  return absl::OkStatus();
}

absl::Status SameDtype(const char* op, const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() == b.scalar_type()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": dtypes ", c10::toString(a.scalar_type()),
                                                 " and ", c10::toString(b.scalar_type()),
                                                 " differ"));
}

absl::Status CheckTokens(const char* name, const at::Tensor& tokens, int64_t rows) {
  if (!tokens.defined() || tokens.scalar_type() != at::kLong || tokens.dim() != 2 ||
      tokens.size(1) != 2 || tokens.size(0) != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention: ", name, " must be int64 [", rows, ", 2] (sequence id, position)",
        tokens.defined()
            ? absl::StrCat(", not ", c10::toString(tokens.scalar_type()), " ", Shape(tokens))
            : ", not undefined"));
  }
  return absl::OkStatus();
}

void OrThrow(const absl::Status& status) {
  if (!status.ok()) ThrowAsTorchError(status);
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  OrThrow(value.status());
  return *std::move(value);
}

// The float64 kernels, each on the device of its (float64, contiguous) arguments.
at::Tensor LinearRowsOn(const at::Tensor& x, const at::Tensor& w_t) {
  return x.is_cuda() ? ValueOrThrow(internal::CudaLinearRows(x, w_t))
                     : internal::LinearRows(x, w_t);
}
at::Tensor GeluForwardOn(const at::Tensor& x) {
  return x.is_cuda() ? ValueOrThrow(internal::CudaGeluForward(x)) : internal::GeluForward(x);
}
at::Tensor GeluBackwardOn(const at::Tensor& x, const at::Tensor& dy) {
  return x.is_cuda() ? ValueOrThrow(internal::CudaGeluBackward(x, dy))
                     : internal::GeluBackward(x, dy);
}
at::Tensor AttentionForwardOn(const internal::Visibility& visible, const at::Tensor& q,
                              const at::Tensor& k, const at::Tensor& v, double scale) {
  return q.is_cuda() ? ValueOrThrow(internal::CudaAttentionForward(visible, q, k, v, scale))
                     : internal::AttentionForward(visible, q, k, v, scale);
}
internal::AttentionGradients AttentionBackwardOn(const internal::Visibility& visible,
                                                 const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, const at::Tensor& dout,
                                                 double scale) {
  return q.is_cuda() ? ValueOrThrow(internal::CudaAttentionBackward(visible, q, k, v, dout, scale))
                     : internal::AttentionBackward(visible, q, k, v, dout, scale);
}

at::Tensor RowLogSumExpOn(const at::Tensor& z) {
  return z.is_cuda() ? ValueOrThrow(internal::CudaRowLogSumExp(z)) : internal::RowLogSumExp(z);
}
at::Tensor RowSoftmaxOn(const at::Tensor& z, const at::Tensor& lse) {
  return z.is_cuda() ? ValueOrThrow(internal::CudaRowSoftmax(z, lse))
                     : internal::RowSoftmax(z, lse);
}
// Each row's float64 sum in increasing column, [M, 1] (Linear's loop against a column of ones:
// every product exact).
at::Tensor RowSumsOn(const at::Tensor& x) {
  return LinearRowsOn(x, at::ones({x.size(1), 1}, x.options()));
}

// x [M, K] times w^T: float64 inside, the result in x's dtype.
at::Tensor LinearOf(const at::Tensor& x, const at::Tensor& w) {
  return LinearRowsOn(Wide(x), Wide(w.t())).to(x.scalar_type());
}

// Note [The kernels as one call]: a kernel's own LibTorch calls (its float64 conversions, its
// allocations sized by the call's rows) are its implementation, not operators of the model: the
// operator recorder (numerics/op_recorder.h) does not see them, so that recordings of a sequence
// alone and packed align on the model's own operators, and a LibTorch operator inside the mode
// is the first to differ (qualification/operator_localization_test.cc).

// Autograd keeps non-tensor arguments as IValues: an ExactGradients travels as its address
// (WeightGradient's precondition keeps it alive).
int64_t Handle(ExactGradients* exact) { return reinterpret_cast<int64_t>(exact); }
// A weight's gradient destination (WeightGradient), kept for backward under keys starting with
// `prefix` (a kernel with several weights names each).
void SaveDestination(AutogradContext* ctx, int64_t exact, int64_t slot,
                     const std::string& prefix = "") {
  ctx->saved_data[prefix + "exact"] = exact;
  ctx->saved_data[prefix + "slot"] = slot;
}
ExactGradients* ExactOf(AutogradContext* ctx, const std::string& prefix = "") {
  return reinterpret_cast<ExactGradients*>(ctx->saved_data[prefix + "exact"].toInt());
}
int SlotOf(AutogradContext* ctx, const std::string& prefix = "") {
  return static_cast<int>(ctx->saved_data[prefix + "slot"].toInt());
}

struct LinearFunction : torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            int64_t exact, int64_t slot) {
    const at::DisableRecordFunctionGuard unrecorded;  // Note [The kernels as one call]
    ctx->save_for_backward({x, w});
    SaveDestination(ctx, exact, slot);
    return LinearOf(x, w);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::DisableRecordFunctionGuard unrecorded;  // Note [The kernels as one call]
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor dy = grads[0];
    // dx = dy w, row by row (invariant); dw = dy^T x: exact sums, or a sum over the call's rows
    // in order.
    at::Tensor dx = LinearOf(dy.to(x.scalar_type()), w.t());
    if (ExactGradients* exact = ExactOf(ctx)) {
      OrThrow(exact->AddOuterProducts(SlotOf(ctx), dy, x));
      return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
    }
    at::Tensor dw = LinearOf(dy.t().to(w.scalar_type()), x.t());
    return {dx, dw, at::Tensor(), at::Tensor()};
  }
};

struct EmbeddingFunction : torch::autograd::Function<EmbeddingFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& ids,
                            int64_t exact, int64_t slot) {
    const at::DisableRecordFunctionGuard unrecorded;  // Note [The kernels as one call]
    ctx->save_for_backward({weight, ids});
    SaveDestination(ctx, exact, slot);
    return weight.index_select(0, ids);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::DisableRecordFunctionGuard unrecorded;  // Note [The kernels as one call]
    const variable_list saved = ctx->get_saved_variables();
    if (ExactGradients* exact = ExactOf(ctx)) {
      OrThrow(exact->AddRows(SlotOf(ctx), saved[1], grads[0]));
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    // Without exact sums: in token order, as LibTorch's CPU embedding backward.
    return {at::zeros_like(saved[0]).index_add_(0, saved[1], grads[0]), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

// A sum over the call's rows of per-token contributions `values` [M, K] to a parameter of
// `sizes` ([K] elements) and `dtype`: into the exact sums saved under `prefix`
// (SaveDestination), or returned, summed in row order.
at::Tensor ColumnsTo(AutogradContext* ctx, const std::string& prefix, const at::Tensor& values,
                     at::IntArrayRef sizes, at::ScalarType dtype) {
  if (ExactGradients* exact = ExactOf(ctx, prefix)) {
    OrThrow(exact->AddColumns(SlotOf(ctx, prefix), values));
    return at::Tensor();
  }
  return RowSumsOn(values.t().contiguous()).view(sizes).to(dtype);
}

// Note [Placement invariance]: every row's statistics by Linear's loop, the rest elementwise.
struct LayerNormFunction : torch::autograd::Function<LayerNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, double eps, int64_t weight_exact,
                            int64_t weight_slot, int64_t bias_exact, int64_t bias_slot) {
    const at::DisableRecordFunctionGuard unrecorded;  // Note [The kernels as one call]
    const at::Tensor xw = Wide(x);
    const double k = static_cast<double>(x.size(1));
    const at::Tensor mean = RowSumsOn(xw) / k;
    const at::Tensor centered = xw - mean;
    const at::Tensor rstd = at::reciprocal(at::sqrt(RowSumsOn(centered * centered) / k + eps));
    ctx->save_for_backward({x, weight, mean, rstd});
    SaveDestination(ctx, weight_exact, weight_slot, "weight_");
    SaveDestination(ctx, bias_exact, bias_slot, "bias_");
    ctx->saved_data["bias_dtype"] =
        static_cast<int64_t>(bias.scalar_type());  // its shape: weight's
    return (centered * rstd * Wide(weight) + Wide(bias)).to(x.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::DisableRecordFunctionGuard unrecorded;  // Note [The kernels as one call]
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &weight = s[1], &mean = s[2], &rstd = s[3];
    const auto bias_dtype = static_cast<at::ScalarType>(ctx->saved_data["bias_dtype"].toInt());
    const double k = static_cast<double>(x.size(1));
    const at::Tensor xhat = (Wide(x) - mean) * rstd;
    const at::Tensor dy = Wide(grads[0]);
    const at::Tensor g = dy * Wide(weight);
    const at::Tensor dx = (g - RowSumsOn(g) / k - xhat * (RowSumsOn(g * xhat) / k)) * rstd;
    return {dx.to(x.scalar_type()),
            ColumnsTo(ctx, "weight_", dy * xhat, weight.sizes(), weight.scalar_type()),
            ColumnsTo(ctx, "bias_", dy, weight.sizes(), bias_dtype),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

struct CrossEntropyFunction : torch::autograd::Function<CrossEntropyFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets) {
    const at::DisableRecordFunctionGuard unrecorded;  // Note [The kernels as one call]
    const at::Tensor z = Wide(logits);
    const at::Tensor lse = RowLogSumExpOn(z);
    ctx->save_for_backward({logits, targets, lse});
    return (lse - z.gather(1, targets.unsqueeze(1)).squeeze(1)).to(logits.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::DisableRecordFunctionGuard unrecorded;  // Note [The kernels as one call]
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &logits = s[0], &targets = s[1], &lse = s[2];
    const at::Tensor p = RowSoftmaxOn(Wide(logits), lse);
    const at::Tensor target = at::zeros_like(p).scatter_(1, targets.unsqueeze(1), 1.0);
    return {((p - target) * Wide(grads[0]).unsqueeze(1)).to(logits.scalar_type()), at::Tensor()};
  }
};

struct GeluFunction : torch::autograd::Function<GeluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    const at::DisableRecordFunctionGuard unrecorded;  // Note [The kernels as one call]
    ctx->save_for_backward({x});
    return GeluForwardOn(Wide(x)).to(x.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::DisableRecordFunctionGuard unrecorded;  // Note [The kernels as one call]
    const at::Tensor x = ctx->get_saved_variables()[0];
    return {GeluBackwardOn(Wide(x), Wide(grads[0])).to(x.scalar_type())};
  }
};

// The visibility travels from forward to backward as the tokens (rebuilt: cheap next to the
// attention itself, and no C++ object in autograd's saved state).
struct AttentionFunction : torch::autograd::Function<AttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& query_tokens,
                            const at::Tensor& key_tokens, double scale) {
    const at::DisableRecordFunctionGuard unrecorded;  // Note [The kernels as one call]
    absl::StatusOr<internal::Visibility> visible = internal::SeeKeys(query_tokens, key_tokens);
    OrThrow(visible.status());
    ctx->save_for_backward({q, k, v, query_tokens, key_tokens});
    ctx->saved_data["scale"] = scale;
    return AttentionForwardOn(*visible, Wide(q), Wide(k), Wide(v), scale).to(q.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::DisableRecordFunctionGuard unrecorded;  // Note [The kernels as one call]
    const variable_list s = ctx->get_saved_variables();
    const double scale = ctx->saved_data["scale"].toDouble();
    absl::StatusOr<internal::Visibility> visible = internal::SeeKeys(s[3], s[4]);
    OrThrow(visible.status());
    const internal::AttentionGradients g =
        AttentionBackwardOn(*visible, Wide(s[0]), Wide(s[1]), Wide(s[2]), Wide(grads[0]), scale);
    return {g.dq.to(s[0].scalar_type()),
            g.dk.to(s[1].scalar_type()),
            g.dv.to(s[2].scalar_type()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

// Each member's `rows` [n, ...] padded to `widest` rows of `fill`, gathered over `group`:
// [size * widest, ...].
at::Tensor GatherPadded(collectives::Communicator* group, const at::Tensor& rows, int64_t widest,
                        double fill, const char* what) {
  std::vector<int64_t> shape = rows.sizes().vec();
  shape[0] = widest;
  at::Tensor padded = at::full(shape, fill, rows.options());
  padded.narrow(0, 0, rows.size(0)).copy_(rows);
  absl::StatusOr<std::vector<at::Tensor>> all = group->AllGather(padded);
  if (!all.ok()) ThrowAsTorchError(Annotate(all.status(), what));
  return at::cat(*all, 0);
}

collectives::Communicator* GroupOf(AutogradContext* ctx) {
  return reinterpret_cast<collectives::Communicator*>(ctx->saved_data["group"].toInt());
}

// ShardedSequenceAttention with a group (Note [Placement invariance]: the keys' gradients are
// computed by every member over all queries, not summed over the members).
struct ShardedAttentionFunction : torch::autograd::Function<ShardedAttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& tokens, double scale,
                            int64_t widest, int64_t group_handle) {
    const at::DisableRecordFunctionGuard unrecorded;  // Note [The kernels as one call]
    auto* group = reinterpret_cast<collectives::Communicator*>(group_handle);
    const at::Tensor keys = GatherPadded(group, k, widest, 0, "gathering the keys");
    const at::Tensor values = GatherPadded(group, v, widest, 0, "gathering the values");
    const at::Tensor all_tokens = GatherPadded(group, tokens, widest, -1, "gathering the tokens");
    const absl::StatusOr<internal::Visibility> visible =
        internal::SeeKeys(tokens.to(at::kCPU).contiguous(), all_tokens.to(at::kCPU).contiguous());
    OrThrow(visible.status());
    ctx->save_for_backward({q, keys, values, all_tokens});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["widest"] = widest;
    ctx->saved_data["group"] = group_handle;
    ctx->saved_data["rows"] = k.size(0);
    return AttentionForwardOn(*visible, Wide(q), Wide(keys), Wide(values), scale)
        .to(q.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::DisableRecordFunctionGuard unrecorded;  // Note [The kernels as one call]
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &keys = s[1], &values = s[2], &all_tokens = s[3];
    collectives::Communicator* group = GroupOf(ctx);
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t widest = ctx->saved_data["widest"].toInt();
    const int64_t rows = ctx->saved_data["rows"].toInt();
    // Every member's queries (their rows are their keys' rows) and output gradients.
    const at::Tensor queries = GatherPadded(group, q, widest, 0, "gathering the queries");
    const at::Tensor dout = GatherPadded(group, grads[0].to(q.scalar_type()), widest, 0,
                                         "gathering the output gradients");
    const at::Tensor cpu_tokens = all_tokens.to(at::kCPU).contiguous();
    const at::Tensor real = (cpu_tokens.select(1, 0) >= 0).nonzero().squeeze(1);
    const absl::StatusOr<internal::Visibility> visible =
        internal::SeeKeys(cpu_tokens.index_select(0, real), cpu_tokens);
    OrThrow(visible.status());
    const at::Tensor on_device = real.to(q.device());
    const internal::AttentionGradients g =
        AttentionBackwardOn(*visible, Wide(queries.index_select(0, on_device)), Wide(keys),
                            Wide(values), Wide(dout.index_select(0, on_device)), scale);
    // This member's queries among the real ones, and its keys' rows.
    const int64_t first = group->rank() * widest;
    const int64_t before = (real < first).sum().item<int64_t>();
    return {g.dq.narrow(0, before, rows).to(q.scalar_type()),
            g.dk.narrow(0, first, rows).to(keys.scalar_type()),
            g.dv.narrow(0, first, rows).to(values.scalar_type()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

absl::Status CheckSlot(const char* op, const WeightGradient& to) {
  if (to.exact != nullptr && to.slot < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": exact gradients without a slot"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<at::Tensor> Linear(const at::Tensor& x, const at::Tensor& w,
                                  WeightGradient w_gradient) {
  LOCKSTEP_RETURN_IF_ERROR(CheckMatrix("Linear", "x", x));
  LOCKSTEP_RETURN_IF_ERROR(CheckMatrix("Linear", "w", w));
  LOCKSTEP_RETURN_IF_ERROR(SameDtype("Linear", x, w));
  LOCKSTEP_RETURN_IF_ERROR(SameDevice("Linear", x, w));
  if (x.size(1) != w.size(1)) {
    return absl::InvalidArgumentError(absl::StrCat("Linear: x ", Shape(x), " and w ", Shape(w),
                                                   " do not chain (w is [out, in])"));
  }
  LOCKSTEP_RETURN_IF_ERROR(CheckSlot("Linear", w_gradient));
  return CallTorch("Linear", [&]() -> absl::StatusOr<at::Tensor> {
    return LinearFunction::apply(x, w, Handle(w_gradient.exact), w_gradient.slot);
  });
}

absl::StatusOr<at::Tensor> Embedding(const at::Tensor& weight, const at::Tensor& ids,
                                     WeightGradient weight_gradient) {
  LOCKSTEP_RETURN_IF_ERROR(CheckMatrix("Embedding", "weight", weight));
  if (!ids.defined() || ids.scalar_type() != at::kLong || ids.dim() != 1) {
    return absl::InvalidArgumentError("Embedding: ids must be int64 [tokens]");
  }
  LOCKSTEP_RETURN_IF_ERROR(CheckSlot("Embedding", weight_gradient));
  return CallTorch("Embedding", [&]() -> absl::StatusOr<at::Tensor> {
    return EmbeddingFunction::apply(weight, ids.to(weight.device()), Handle(weight_gradient.exact),
                                    weight_gradient.slot);
  });
}

absl::StatusOr<at::Tensor> LayerNorm(const at::Tensor& x, const at::Tensor& weight,
                                     const at::Tensor& bias, double eps,
                                     WeightGradient weight_gradient, WeightGradient bias_gradient) {
  LOCKSTEP_RETURN_IF_ERROR(CheckMatrix("LayerNorm", "x", x));
  LOCKSTEP_RETURN_IF_ERROR(CheckFloating("LayerNorm", "weight", weight));
  LOCKSTEP_RETURN_IF_ERROR(CheckFloating("LayerNorm", "bias", bias));
  LOCKSTEP_RETURN_IF_ERROR(SameDevice("LayerNorm", x, weight));
  LOCKSTEP_RETURN_IF_ERROR(SameDevice("LayerNorm", x, bias));
  if (weight.dim() != 1 || bias.dim() != 1 || weight.size(0) != x.size(1) ||
      bias.size(0) != x.size(1)) {
    return absl::InvalidArgumentError(absl::StrCat("LayerNorm: x ", Shape(x), ", weight ",
                                                   Shape(weight), " and bias ", Shape(bias),
                                                   " do not fit (weight and bias [columns])"));
  }
  if (!(eps > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("LayerNorm: eps ", eps, " is not positive"));
  }
  LOCKSTEP_RETURN_IF_ERROR(CheckSlot("LayerNorm", weight_gradient));
  LOCKSTEP_RETURN_IF_ERROR(CheckSlot("LayerNorm", bias_gradient));
  return CallTorch("LayerNorm", [&]() -> absl::StatusOr<at::Tensor> {
    return LayerNormFunction::apply(x, weight, bias, eps, Handle(weight_gradient.exact),
                                    weight_gradient.slot, Handle(bias_gradient.exact),
                                    bias_gradient.slot);
  });
}

absl::StatusOr<at::Tensor> CrossEntropy(const at::Tensor& logits, const at::Tensor& targets) {
  LOCKSTEP_RETURN_IF_ERROR(CheckMatrix("CrossEntropy", "logits", logits));
  if (!targets.defined() || targets.scalar_type() != at::kLong || targets.dim() != 1 ||
      targets.size(0) != logits.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat("CrossEntropy: targets must be int64 [",
                                                   logits.size(0), "] for logits ", Shape(logits)));
  }
  if (logits.size(1) == 0) {
    return absl::InvalidArgumentError("CrossEntropy: logits have no classes");
  }
  return CallTorch("CrossEntropy", [&]() -> absl::StatusOr<at::Tensor> {
    if (targets.numel() > 0) {
      const auto [min, max] = at::aminmax(targets);
      const at::Tensor range = at::stack({min, max}).to(at::kCPU);  // one read-back
      const int64_t low = range[0].item<int64_t>(), high = range[1].item<int64_t>();
      if (low < 0 || high >= logits.size(1)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "CrossEntropy: target ", low < 0 ? low : high, " outside [0, ", logits.size(1), ")"));
      }
    }
    return CrossEntropyFunction::apply(logits, targets.to(logits.device()));
  });
}

absl::StatusOr<at::Tensor> Gelu(const at::Tensor& x) {
  LOCKSTEP_RETURN_IF_ERROR(CheckFloating("Gelu", "x", x));
  return CallTorch("Gelu", [&]() -> absl::StatusOr<at::Tensor> { return GeluFunction::apply(x); });
}

absl::StatusOr<at::Tensor> SequenceAttention(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& query_tokens,
                                             const at::Tensor& key_tokens, double scale) {
  LOCKSTEP_RETURN_IF_ERROR(CheckMatrix("SequenceAttention", "q", q));
  LOCKSTEP_RETURN_IF_ERROR(CheckMatrix("SequenceAttention", "k", k));
  LOCKSTEP_RETURN_IF_ERROR(CheckMatrix("SequenceAttention", "v", v));
  LOCKSTEP_RETURN_IF_ERROR(SameDtype("SequenceAttention", q, k));
  LOCKSTEP_RETURN_IF_ERROR(SameDtype("SequenceAttention", q, v));
  LOCKSTEP_RETURN_IF_ERROR(SameDevice("SequenceAttention", q, k));
  LOCKSTEP_RETURN_IF_ERROR(SameDevice("SequenceAttention", q, v));
  if (q.size(1) != k.size(1) || k.size(0) != v.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat("SequenceAttention: q ", Shape(q), ", k ",
                                                   Shape(k), " and v ", Shape(v),
                                                   " do not fit (q and k one width, k and v one "
                                                   "row count)"));
  }
  LOCKSTEP_RETURN_IF_ERROR(CheckTokens("query_tokens", query_tokens, q.size(0)));
  LOCKSTEP_RETURN_IF_ERROR(CheckTokens("key_tokens", key_tokens, k.size(0)));
  return CallTorch("SequenceAttention", [&]() -> absl::StatusOr<at::Tensor> {
    return AttentionFunction::apply(q, k, v, query_tokens.to(at::kCPU).contiguous(),
                                    key_tokens.to(at::kCPU).contiguous(), scale);
  });
}

absl::StatusOr<at::Tensor> ShardedSequenceAttention(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, const at::Tensor& tokens,
                                                    double scale, int64_t widest,
                                                    collectives::Communicator* group) {
  if (group == nullptr) return SequenceAttention(q, k, v, tokens, tokens, scale);
  LOCKSTEP_RETURN_IF_ERROR(CheckMatrix("ShardedSequenceAttention", "q", q));
  LOCKSTEP_RETURN_IF_ERROR(CheckMatrix("ShardedSequenceAttention", "k", k));
  LOCKSTEP_RETURN_IF_ERROR(CheckMatrix("ShardedSequenceAttention", "v", v));
  LOCKSTEP_RETURN_IF_ERROR(SameDtype("ShardedSequenceAttention", q, k));
  LOCKSTEP_RETURN_IF_ERROR(SameDtype("ShardedSequenceAttention", q, v));
  if (q.size(0) != k.size(0) || k.size(0) != v.size(0) || q.size(1) != k.size(1) ||
      q.size(0) > widest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ShardedSequenceAttention: q ", Shape(q), ", k ", Shape(k), " and v ", Shape(v),
        " must share their rows (at most widest = ", widest, ") and q and k their width"));
  }
  LOCKSTEP_RETURN_IF_ERROR(CheckTokens("tokens", tokens, q.size(0)));
  return CallTorch("ShardedSequenceAttention", [&]() -> absl::StatusOr<at::Tensor> {
    return ShardedAttentionFunction::apply(q, k, v, tokens.to(q.device()), scale, widest,
                                           reinterpret_cast<int64_t>(group));
  });
}

}  // namespace invariant
}  // namespace lockstep
