#include "invariant/ops.h"

#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "invariant/internal/cpu_kernels.h"
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
  if (!t.is_cpu()) {
    return absl::UnimplementedError(
        absl::StrCat(op, ": ", name, " is on ", t.device().str(),
                     "; the placement-invariant kernels run on the CPU only so far"));
  }
  return absl::OkStatus();
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
        "SequenceAttention: ", name, " must be int64 [", rows, ", 2] (sequence id, position)",
        tokens.defined()
            ? absl::StrCat(", not ", c10::toString(tokens.scalar_type()), " ", Shape(tokens))
            : ", not undefined"));
  }
  return absl::OkStatus();
}

void OrThrow(const absl::Status& status) {
  if (!status.ok()) ThrowAsTorchError(status);
}

// x [M, K] times w^T: float64 inside, the result in x's dtype.
at::Tensor LinearOf(const at::Tensor& x, const at::Tensor& w) {
  return internal::LinearRows(Wide(x), Wide(w.t())).to(x.scalar_type());
}

struct LinearFunction : torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    ctx->save_for_backward({x, w});
    return LinearOf(x, w);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor dy = grads[0];
    // dx = dy w, row by row (invariant); dw = dy^T x, a sum over the call's rows in order.
    at::Tensor dx = LinearOf(dy.to(x.scalar_type()), w.t());
    at::Tensor dw = LinearOf(dy.t().to(w.scalar_type()), x.t());
    return {dx, dw};
  }
};

struct GeluFunction : torch::autograd::Function<GeluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    return internal::GeluForward(Wide(x)).to(x.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    return {internal::GeluBackward(Wide(x), Wide(grads[0])).to(x.scalar_type())};
  }
};

// The visibility travels from forward to backward as the tokens (rebuilt: cheap next to the
// attention itself, and no C++ object in autograd's saved state).
struct AttentionFunction : torch::autograd::Function<AttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& query_tokens,
                            const at::Tensor& key_tokens, double scale) {
    absl::StatusOr<internal::Visibility> visible = internal::SeeKeys(query_tokens, key_tokens);
    OrThrow(visible.status());
    ctx->save_for_backward({q, k, v, query_tokens, key_tokens});
    ctx->saved_data["scale"] = scale;
    return internal::AttentionForward(*visible, Wide(q), Wide(k), Wide(v), scale)
        .to(q.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const double scale = ctx->saved_data["scale"].toDouble();
    absl::StatusOr<internal::Visibility> visible = internal::SeeKeys(s[3], s[4]);
    OrThrow(visible.status());
    const internal::AttentionGradients g = internal::AttentionBackward(
        *visible, Wide(s[0]), Wide(s[1]), Wide(s[2]), Wide(grads[0]), scale);
    return {g.dq.to(s[0].scalar_type()),
            g.dk.to(s[1].scalar_type()),
            g.dv.to(s[2].scalar_type()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

absl::StatusOr<at::Tensor> Linear(const at::Tensor& x, const at::Tensor& w) {
  LOCKSTEP_RETURN_IF_ERROR(CheckMatrix("Linear", "x", x));
  LOCKSTEP_RETURN_IF_ERROR(CheckMatrix("Linear", "w", w));
  LOCKSTEP_RETURN_IF_ERROR(SameDtype("Linear", x, w));
  if (x.size(1) != w.size(1)) {
    return absl::InvalidArgumentError(absl::StrCat("Linear: x ", Shape(x), " and w ", Shape(w),
                                                   " do not chain (w is [out, in])"));
  }
  return CallTorch("Linear",
                   [&]() -> absl::StatusOr<at::Tensor> { return LinearFunction::apply(x, w); });
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

}  // namespace invariant
}  // namespace lockstep
