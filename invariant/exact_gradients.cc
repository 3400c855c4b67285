#include "invariant/exact_gradients.h"

#include <algorithm>
#include <cmath>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"

namespace lockstep {
namespace invariant {
namespace {

std::string Shape(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

// `value` (float64) as a two's complement multiple of 2^-kFractionBits, rounded to nearest (ties
// to even); false when it is not finite or too large.
bool ToFixed(double value, unsigned __int128* fixed) {
  if (!std::isfinite(value) || std::fabs(value) >= std::ldexp(1.0, ExactGradients::kMaxExponent)) {
    return false;
  }
  const double scaled = std::nearbyint(std::ldexp(value, ExactGradients::kFractionBits));
  *fixed = static_cast<unsigned __int128>(static_cast<__int128>(scaled));
  return true;
}

double FromFixed(unsigned __int128 fixed) {
  return std::ldexp(static_cast<double>(static_cast<__int128>(fixed)),
                    -ExactGradients::kFractionBits);
}

at::Tensor HostDouble(const at::Tensor& t) { return t.to(at::kCPU).to(at::kDouble).contiguous(); }

}  // namespace

ExactGradients::ExactGradients(std::vector<std::pair<std::string, at::Tensor>> parameters) {
  for (auto& [name, parameter] : parameters) {
    slots_.push_back({name, parameter,
                      std::vector<unsigned __int128>(static_cast<size_t>(parameter.numel()), 0),
                      0});
  }
}

absl::StatusOr<int> ExactGradients::SlotOf(const std::string& name) const {
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].name == name) return static_cast<int>(s);
  }
  return absl::NotFoundError(absl::StrCat("exact gradients: no parameter '", name, "'"));
}

absl::StatusOr<ExactGradients::Slot*> ExactGradients::Take(int slot, int64_t terms) {
  if (slot < 0 || static_cast<size_t>(slot) >= slots_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("exact gradients: slot ", slot, " of ", slots_.size()));
  }
  Slot& s = slots_[slot];
  if (s.terms + terms > (int64_t{1} << kMaxTermsLog2)) {
    return absl::OutOfRangeError(absl::StrCat(
        "exact gradients of '", s.name, "': ", s.terms + terms,
        " contributions per element since the last write; the limit is 2^", kMaxTermsLog2));
  }
  s.terms += terms;
  return &s;
}

absl::Status ExactGradients::AddOuterProducts(int slot, const at::Tensor& a, const at::Tensor& b) {
  if (a.dim() != 2 || b.dim() != 2 || a.size(0) != b.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat("exact gradients: outer products of ", Shape(a),
                                                   " and ", Shape(b), " (both [tokens, ...])"));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(Slot * s, Take(slot, a.size(0)));
  if (s->parameter.dim() != 2 || s->parameter.size(0) != a.size(1) ||
      s->parameter.size(1) != b.size(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("exact gradients of '", s->name, "' ", Shape(s->parameter),
                     ": outer products of ", Shape(a), " and ", Shape(b), " do not fit"));
  }
  at::Tensor ha, hb;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: the contributions to the host", [&] {
    ha = HostDouble(a);
    hb = HostDouble(b);
  }));
  const int64_t tokens = a.size(0), n = a.size(1), k = b.size(1);
  const double* ap = ha.data_ptr<double>();
  const double* bp = hb.data_ptr<double>();
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        unsigned __int128 fixed = 0;
        if (!ToFixed(ap[t * n + i] * bp[t * k + j], &fixed)) {
          return absl::OutOfRangeError(absl::StrCat(
              "exact gradients of '", s->name, "': contribution ", ap[t * n + i] * bp[t * k + j],
              " to element (", i, ", ", j, ") is not finite or not below 2^", kMaxExponent));
        }
        s->sums[i * k + j] += fixed;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ExactGradients::AddRows(int slot, const at::Tensor& rows, const at::Tensor& values) {
  if (rows.dim() != 1 || values.dim() != 2 || rows.size(0) != values.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat("exact gradients: rows ", Shape(rows),
                                                   " and values ", Shape(values)));
  }
  // Each row receives at most one term per token: counted as that many.
  LOCKSTEP_ASSIGN_OR_RETURN(Slot * s, Take(slot, values.size(0)));
  if (s->parameter.dim() != 2 || s->parameter.size(1) != values.size(1)) {
    return absl::InvalidArgumentError(absl::StrCat("exact gradients of '", s->name, "' ",
                                                   Shape(s->parameter), ": rows of ",
                                                   Shape(values), " do not fit"));
  }
  at::Tensor hr, hv;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: the rows to the host", [&] {
    hr = rows.to(at::kCPU).to(at::kLong).contiguous();
    hv = HostDouble(values);
  }));
  const int64_t tokens = values.size(0), k = values.size(1), limit = s->parameter.size(0);
  const int64_t* rp = hr.data_ptr<int64_t>();
  const double* vp = hv.data_ptr<double>();
  for (int64_t t = 0; t < tokens; ++t) {
    if (rp[t] < 0 || rp[t] >= limit) {
      return absl::InvalidArgumentError(absl::StrCat("exact gradients of '", s->name, "': row ",
                                                     rp[t], " outside [0, ", limit, ")"));
    }
    for (int64_t j = 0; j < k; ++j) {
      unsigned __int128 fixed = 0;
      if (!ToFixed(vp[t * k + j], &fixed)) {
        return absl::OutOfRangeError(absl::StrCat("exact gradients of '", s->name,
                                                  "': contribution ", vp[t * k + j], " to row ",
                                                  rp[t], " is not finite or not below 2^",
                                                  kMaxExponent));
      }
      s->sums[rp[t] * k + j] += fixed;
    }
  }
  return absl::OkStatus();
}

absl::Status ExactGradients::SumOver(collectives::Communicator* group,
                                     const std::set<std::string>& whole) {
  if (group == nullptr || group->size() == 1) return absl::OkStatus();
  std::vector<Slot*> summed;
  for (Slot& s : slots_) {
    if (!whole.count(s.name)) summed.push_back(&s);
  }
  // Four 32-bit limbs per sum, each in an int64: a member's limbs add without carrying out of
  // their slot (at most 2^31 members), and the carries are taken after the reduction.
  int64_t elements = 0;
  for (const Slot* s : summed) elements += static_cast<int64_t>(s->sums.size());
  at::Tensor limbs;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: packing the sums", [&] {
    limbs = at::empty({elements, 4}, at::kLong);
    int64_t* lp = limbs.data_ptr<int64_t>();
    for (const Slot* s : summed) {
      for (unsigned __int128 v : s->sums) {
        for (int l = 0; l < 4; ++l) *lp++ = static_cast<int64_t>((v >> (32 * l)) & 0xFFFFFFFFu);
      }
    }
  }));
  // On the parameters' device, where the group's collectives run (a GPU for NCCL).
  at::Tensor reduced;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: to the group's device", [&] {
    reduced = slots_.empty() ? limbs : limbs.to(slots_[0].parameter.device());
  }));
  LOCKSTEP_RETURN_IF_ERROR(Annotate(group->AllReduceSum(reduced), "summing exact gradients"));
  LOCKSTEP_RETURN_IF_ERROR(
      CallTorch("exact gradients: back to the host", [&] { reduced = reduced.to(at::kCPU); }));
  const int64_t* lp = reduced.data_ptr<int64_t>();
  for (Slot* s : summed) {
    for (unsigned __int128& v : s->sums) {
      v = 0;
      for (int l = 0; l < 4; ++l) {
        v += static_cast<unsigned __int128>(static_cast<uint64_t>(*lp++)) << (32 * l);
      }
    }
    s->terms *= group->size();
  }
  return absl::OkStatus();
}

absl::Status ExactGradients::WriteGradients() {
  for (Slot& s : slots_) {
    LOCKSTEP_RETURN_IF_ERROR(CallTorch(absl::StrCat("exact gradients: writing '", s.name, "'"), [&] {
      at::Tensor sum = at::empty({static_cast<int64_t>(s.sums.size())}, at::kDouble);
      double* sp = sum.data_ptr<double>();
      for (size_t e = 0; e < s.sums.size(); ++e) sp[e] = FromFixed(s.sums[e]);
      s.parameter.mutable_grad() =
          sum.view(s.parameter.sizes()).to(s.parameter.scalar_type()).to(s.parameter.device());
    }));
  }
  Zero();
  return absl::OkStatus();
}

void ExactGradients::Zero() {
  for (Slot& s : slots_) {
    std::fill(s.sums.begin(), s.sums.end(), 0);
    s.terms = 0;
  }
}

}  // namespace invariant
}  // namespace lockstep
