#include "invariant/exact_gradients.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "invariant/internal/device_exact.h"

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

// A float32 value as mantissa * 2^exponent (mantissa signed, |mantissa| < 2^24); false for a
// value that is not finite.
struct Split {
  int32_t mantissa;
  int32_t exponent;
};
bool SplitFloat(float value, Split* out) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint32_t field = (bits >> 23) & 0xFF, fraction = bits & 0x7FFFFF;
  if (field == 0xFF) return false;
  const int32_t magnitude = static_cast<int32_t>(field == 0 ? fraction : fraction | 0x800000);
  out->mantissa = (bits >> 31) ? -magnitude : magnitude;
  out->exponent = field == 0 ? -149 : static_cast<int32_t>(field) - 150;
  return true;
}

// Note [Products as integers]: a product of two float32 values is mantissa * 2^exponent with a
// 48-bit integer mantissa, so its multiple of 2^-kFractionBits is that mantissa shifted, and
// rounding (a shift right) is integer arithmetic: no float64 conversion per product. The result
// equals ToFixed of the product computed in float64 (exact there), rounding included (to nearest,
// ties to even).
//
// FixedProduct: the product's multiple of 2^-kFractionBits. Precondition: the product is below
// 2^kMaxExponent in magnitude (ProductFits).
inline unsigned __int128 FixedProduct(Split a, Split b) {
  const int64_t mantissa = static_cast<int64_t>(a.mantissa) * b.mantissa;
  const int shift = a.exponent + b.exponent + ExactGradients::kFractionBits;
  if (shift >= 0) return static_cast<unsigned __int128>(static_cast<__int128>(mantissa)) << shift;
  const int right = -shift;
  if (right >= 62) return 0;             // |mantissa| < 2^48: below half of 2^right
  int64_t quotient = mantissa >> right;  // floor
  const int64_t remainder = mantissa - quotient * (int64_t{1} << right);
  const int64_t half = int64_t{1} << (right - 1);
  if (remainder > half || (remainder == half && (quotient & 1))) ++quotient;
  return static_cast<unsigned __int128>(static_cast<__int128>(quotient));
}

// Whether the product is below 2^kMaxExponent in magnitude.
bool ProductFits(Split a, Split b) {
  const int64_t mantissa = static_cast<int64_t>(a.mantissa) * b.mantissa;
  if (mantissa == 0) return true;
  const uint64_t magnitude = static_cast<uint64_t>(mantissa < 0 ? -mantissa : mantissa);
  const int bits = 64 - __builtin_clzll(magnitude);
  return bits + a.exponent + b.exponent <= ExactGradients::kMaxExponent;
}

// A bound on a split value's magnitude: it is below 2^Top.
int Top(Split v) {
  if (v.mantissa == 0) return -1000;
  const uint32_t magnitude = static_cast<uint32_t>(v.mantissa < 0 ? -v.mantissa : v.mantissa);
  return v.exponent + 32 - __builtin_clz(magnitude);
}

bool FloatExact(at::ScalarType type) {
  return type == at::kFloat || type == at::kBFloat16 || type == at::kHalf;
}

// Whether a bound clears every contribution on the device: each finite and below 2^kMaxExponent
// in magnitude, `largest` being the largest magnitude a contribution can have (a float64 tensor
// of one or more such bounds). One value read back. False sends the call to the host, whose
// checks are per contribution and name the one refused.
absl::StatusOr<bool> Cleared(const at::Tensor& largest) {
  bool cleared = false;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: bounding the contributions", [&] {
    cleared = (largest < std::ldexp(1.0, ExactGradients::kMaxExponent)).all().item<bool>();
  }));
  return cleared;
}

}  // namespace

ExactGradients::ExactGradients(std::vector<std::pair<std::string, at::Tensor>> parameters) {
  for (auto& [name, parameter] : parameters) {
    Slot s;
    s.name = name;
    s.parameter = parameter;
    if (!parameter.is_cuda()) ReadyHostSums(s);
    slots_.push_back(std::move(s));
  }
}

absl::StatusOr<int> ExactGradients::SlotOf(const std::string& name) const {
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].name == name) return static_cast<int>(s);
  }
  return absl::NotFoundError(absl::StrCat("exact gradients: no parameter '", name, "'"));
}

absl::StatusOr<ExactGradients::Slot*> ExactGradients::At(int slot) {
  if (slot < 0 || static_cast<size_t>(slot) >= slots_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("exact gradients: slot ", slot, " of ", slots_.size()));
  }
  return &slots_[slot];
}

absl::Status ExactGradients::Room(const Slot& s, int64_t terms) {
  if (s.terms + terms > (int64_t{1} << kMaxTermsLog2)) {
    return absl::OutOfRangeError(absl::StrCat(
        "exact gradients of '", s.name, "': ", s.terms + terms,
        " contributions per element since the last write; the limit is 2^", kMaxTermsLog2));
  }
  return absl::OkStatus();
}

bool ExactGradients::OnDevice(const Slot& s, const at::Tensor& t) {
  return s.parameter.is_cuda() && t.device() == s.parameter.device();
}

absl::StatusOr<at::Tensor*> ExactGradients::DeviceSums(Slot& s) {
  if (s.device_sums.defined()) return &s.device_sums;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: sums on the device", [&] {
    s.device_sums = at::zeros({s.parameter.numel(), 2}, s.parameter.options().dtype(at::kLong));
  }));
  return &s.device_sums;
}

void ExactGradients::ReadyHostSums(Slot& s) {
  if (s.sums.empty()) s.sums.assign(static_cast<size_t>(s.parameter.numel()), 0);
}

void ExactGradients::Deposited(Slot& s, int64_t terms, bool on_host) {
  s.terms += terms;
  if (on_host && s.parameter.is_cuda()) s.host_pending = true;
}

absl::StatusOr<bool> ExactGradients::DepositOnDevice(
    Slot& s, int64_t terms, const at::Tensor& largest,
    absl::FunctionRef<absl::Status(at::Tensor&)> launch) {
  LOCKSTEP_ASSIGN_OR_RETURN(const bool cleared, Cleared(largest));
  if (!cleared) return false;
  LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor * sums, DeviceSums(s));
  LOCKSTEP_RETURN_IF_ERROR(launch(*sums));
  Deposited(s, terms, /*on_host=*/false);
  return true;
}

absl::Status ExactGradients::Gather(Slot& s) {
  if (!s.host_pending) return absl::OkStatus();
  LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor * sums, DeviceSums(s));
  at::Tensor words;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: the host's deposits to the device", [&] {
    words = at::empty({static_cast<int64_t>(s.sums.size()), 2}, at::kLong);
    int64_t* w = words.data_ptr<int64_t>();
    for (size_t e = 0; e < s.sums.size(); ++e) {
      w[2 * e] = static_cast<int64_t>(static_cast<uint64_t>(s.sums[e]));
      w[2 * e + 1] = static_cast<int64_t>(static_cast<uint64_t>(s.sums[e] >> 64));
    }
    words = words.to(sums->device());
  }));
  LOCKSTEP_RETURN_IF_ERROR(internal::CudaAddWords(words, *sums));
  std::fill(s.sums.begin(), s.sums.end(), 0);
  s.host_pending = false;
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> ExactGradients::Rounded(Slot& s) {
  if (s.parameter.is_cuda()) {
    LOCKSTEP_RETURN_IF_ERROR(Gather(s));
    if (s.device_sums.defined()) return internal::CudaToDouble(s.device_sums, kFractionBits);
    return CallTorch("exact gradients: zero sums", [&]() -> absl::StatusOr<at::Tensor> {
      return at::zeros({s.parameter.numel()}, s.parameter.options().dtype(at::kDouble));
    });
  }
  return CallTorch("exact gradients: reading the sums", [&]() -> absl::StatusOr<at::Tensor> {
    at::Tensor sum = at::empty({static_cast<int64_t>(s.sums.size())}, at::kDouble);
    double* sp = sum.data_ptr<double>();
    for (size_t e = 0; e < s.sums.size(); ++e) sp[e] = FromFixed(s.sums[e]);
    return sum;
  });
}

absl::Status ExactGradients::AddOuterProducts(int slot, const at::Tensor& a, const at::Tensor& b) {
  if (a.dim() != 2 || b.dim() != 2 || a.size(0) != b.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat("exact gradients: outer products of ", Shape(a),
                                                   " and ", Shape(b), " (both [tokens, ...])"));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(Slot * s, At(slot));
  if (s->parameter.dim() != 2 || s->parameter.size(0) != a.size(1) ||
      s->parameter.size(1) != b.size(1)) {
    return absl::InvalidArgumentError(absl::StrCat("exact gradients of '", s->name, "' ",
                                                   Shape(s->parameter), ": outer products of ",
                                                   Shape(a), " and ", Shape(b), " do not fit"));
  }
  LOCKSTEP_RETURN_IF_ERROR(Room(*s, a.size(0)));
  const int64_t tokens = a.size(0), n = a.size(1), k = b.size(1);
  if (tokens == 0) return absl::OkStatus();
  if (FloatExact(a.scalar_type()) && FloatExact(b.scalar_type()) && OnDevice(*s, a) &&
      OnDevice(*s, b)) {
    // On the device, when the rows' largest factors bound every product (Note [Products as
    // integers]: float32 products are exact in float64).
    at::Tensor fa, fb, largest;
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: the factors on the device", [&] {
      fa = a.to(at::kFloat).contiguous();
      fb = b.to(at::kFloat).contiguous();
      largest = fa.abs().amax(1).to(at::kDouble) * fb.abs().amax(1).to(at::kDouble);
    }));
    LOCKSTEP_ASSIGN_OR_RETURN(const bool deposited,
                              DepositOnDevice(*s, tokens, largest, [&](at::Tensor& sums) {
                                return internal::CudaAddOuterProducts(fa, fb, kFractionBits, sums);
                              }));
    if (deposited) return absl::OkStatus();
  }
  if (FloatExact(a.scalar_type()) && FloatExact(b.scalar_type())) {
    // Note [Products as integers]: both factors split once, each product in integers.
    at::Tensor fa, fb;
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: the contributions to the host", [&] {
      fa = a.to(at::kCPU).to(at::kFloat).contiguous();
      fb = b.to(at::kCPU).to(at::kFloat).contiguous();
    }));
    std::vector<Split> sa(static_cast<size_t>(tokens * n)), sb(static_cast<size_t>(tokens * k));
    const float* fap = fa.data_ptr<float>();
    const float* fbp = fb.data_ptr<float>();
    for (size_t e = 0; e < sa.size(); ++e) {
      if (!SplitFloat(fap[e], &sa[e])) {
        return absl::OutOfRangeError(absl::StrCat("exact gradients of '", s->name, "': a factor ",
                                                  fap[e], " is not finite"));
      }
    }
    for (size_t e = 0; e < sb.size(); ++e) {
      if (!SplitFloat(fbp[e], &sb[e])) {
        return absl::OutOfRangeError(absl::StrCat("exact gradients of '", s->name, "': a factor ",
                                                  fbp[e], " is not finite"));
      }
    }
    // Every product checked before anything is added (a refusal adds nothing): a token whose
    // largest factors' bounds multiply below 2^kMaxExponent needs no product checked.
    for (int64_t t = 0; t < tokens; ++t) {
      int top_a = -1000, top_b = -1000;
      for (int64_t i = 0; i < n; ++i) top_a = std::max(top_a, Top(sa[t * n + i]));
      for (int64_t j = 0; j < k; ++j) top_b = std::max(top_b, Top(sb[t * k + j]));
      if (top_a + top_b <= kMaxExponent) continue;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < k; ++j) {
          if (ProductFits(sa[t * n + i], sb[t * k + j])) continue;
          return absl::OutOfRangeError(
              absl::StrCat("exact gradients of '", s->name, "': contribution ",
                           static_cast<double>(fap[t * n + i]) * fbp[t * k + j], " to element (", i,
                           ", ", j, ") is not below 2^", kMaxExponent));
        }
      }
    }
    // a transposed, so that one element's terms are contiguous; the sums of a row's block of
    // columns stay in registers over every token, and b's block of columns in cache over the
    // rows (integer sums: any order and split over threads gives the same bits).
    std::vector<Split> sa_t(sa.size());
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < n; ++i) sa_t[i * tokens + t] = sa[t * n + i];
    }
    ReadyHostSums(*s);
    constexpr int64_t kBlock = 32;
    at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
      unsigned __int128 acc[kBlock];
      for (int64_t j0 = 0; j0 < k; j0 += kBlock) {
        const int64_t width = std::min(kBlock, k - j0);
        for (int64_t i = begin; i < end; ++i) {
          std::fill(acc, acc + width, 0);
          const Split* column = sa_t.data() + i * tokens;
          for (int64_t t = 0; t < tokens; ++t) {
            const Split x = column[t];
            if (x.mantissa == 0) continue;
            const Split* y = sb.data() + t * k + j0;
            for (int64_t j = 0; j < width; ++j) acc[j] += FixedProduct(x, y[j]);
          }
          unsigned __int128* row = s->sums.data() + i * k + j0;
          for (int64_t j = 0; j < width; ++j) row[j] += acc[j];
        }
      }
    });
    Deposited(*s, tokens, /*on_host=*/true);
    return absl::OkStatus();
  }
  at::Tensor ha, hb;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: the contributions to the host", [&] {
    ha = HostDouble(a);
    hb = HostDouble(b);
  }));
  const double* ap = ha.data_ptr<double>();
  const double* bp = hb.data_ptr<double>();
  // Every product checked (pass 0) before anything is added (pass 1): a refusal adds nothing.
  ReadyHostSums(*s);
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < k; ++j) {
          unsigned __int128 fixed = 0;
          if (!ToFixed(ap[t * n + i] * bp[t * k + j], &fixed)) {
            return absl::OutOfRangeError(absl::StrCat(
                "exact gradients of '", s->name, "': contribution ", ap[t * n + i] * bp[t * k + j],
                " to element (", i, ", ", j, ") is not finite or not below 2^", kMaxExponent));
          }
          if (pass == 1) s->sums[i * k + j] += fixed;
        }
      }
    }
  }
  Deposited(*s, tokens, /*on_host=*/true);
  return absl::OkStatus();
}

absl::Status ExactGradients::AddRows(int slot, const at::Tensor& rows, const at::Tensor& values) {
  if (rows.dim() != 1 || values.dim() != 2 || rows.size(0) != values.size(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("exact gradients: rows ", Shape(rows), " and values ", Shape(values)));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(Slot * s, At(slot));
  if (s->parameter.dim() != 2 || s->parameter.size(1) != values.size(1)) {
    return absl::InvalidArgumentError(absl::StrCat("exact gradients of '", s->name, "' ",
                                                   Shape(s->parameter), ": rows of ", Shape(values),
                                                   " do not fit"));
  }
  // Each row receives at most one term per token: counted as that many.
  const int64_t tokens = values.size(0), k = values.size(1), limit = s->parameter.size(0);
  LOCKSTEP_RETURN_IF_ERROR(Room(*s, tokens));
  if (tokens == 0) return absl::OkStatus();
  if (OnDevice(*s, rows) && OnDevice(*s, values)) {
    at::Tensor dr, dv, largest;
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: the rows on the device", [&] {
      dr = rows.to(at::kLong).contiguous();
      dv = values.to(at::kDouble).contiguous();
      // A row outside [0, limit) makes the bound infinite: refused on the host, named.
      const at::Tensor outside = (dr.min() < 0).logical_or(dr.max() >= limit);
      largest = at::where(outside, std::numeric_limits<double>::infinity(), dv.abs().max());
    }));
    LOCKSTEP_ASSIGN_OR_RETURN(const bool deposited,
                              DepositOnDevice(*s, tokens, largest, [&](at::Tensor& sums) {
                                return internal::CudaAddRows(dr, dv, kFractionBits, sums);
                              }));
    if (deposited) return absl::OkStatus();
  }
  at::Tensor hr, hv;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: the rows to the host", [&] {
    hr = rows.to(at::kCPU).to(at::kLong).contiguous();
    hv = HostDouble(values);
  }));
  const int64_t* rp = hr.data_ptr<int64_t>();
  const double* vp = hv.data_ptr<double>();
  // Every row and value checked before anything is added: a refusal adds nothing.
  for (int64_t t = 0; t < tokens; ++t) {
    if (rp[t] < 0 || rp[t] >= limit) {
      return absl::InvalidArgumentError(absl::StrCat("exact gradients of '", s->name, "': row ",
                                                     rp[t], " outside [0, ", limit, ")"));
    }
  }
  std::vector<unsigned __int128> fixed(static_cast<size_t>(tokens * k));
  for (int64_t e = 0; e < tokens * k; ++e) {
    if (!ToFixed(vp[e], &fixed[e])) {
      return absl::OutOfRangeError(absl::StrCat("exact gradients of '", s->name, "': contribution ",
                                                vp[e], " to row ", rp[e / k],
                                                " is not finite or not below 2^", kMaxExponent));
    }
  }
  ReadyHostSums(*s);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < k; ++j) s->sums[rp[t] * k + j] += fixed[t * k + j];
  }
  Deposited(*s, tokens, /*on_host=*/true);
  return absl::OkStatus();
}

absl::Status ExactGradients::AddColumns(int slot, const at::Tensor& values) {
  LOCKSTEP_ASSIGN_OR_RETURN(Slot * s, At(slot));
  if (values.dim() != 2 || values.size(1) != s->parameter.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("exact gradients of '", s->name, "' ",
                                                   Shape(s->parameter), ": columns of ",
                                                   Shape(values), " do not fit"));
  }
  const int64_t tokens = values.size(0), k = values.size(1);
  LOCKSTEP_RETURN_IF_ERROR(Room(*s, tokens));
  if (tokens == 0) return absl::OkStatus();
  if (OnDevice(*s, values)) {
    at::Tensor dv, largest;
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: the columns on the device", [&] {
      dv = values.to(at::kDouble).contiguous();
      largest = dv.abs().max();
    }));
    LOCKSTEP_ASSIGN_OR_RETURN(const bool deposited,
                              DepositOnDevice(*s, tokens, largest, [&](at::Tensor& sums) {
                                return internal::CudaAddColumns(dv, kFractionBits, sums);
                              }));
    if (deposited) return absl::OkStatus();
  }
  at::Tensor hv;
  LOCKSTEP_RETURN_IF_ERROR(
      CallTorch("exact gradients: the columns to the host", [&] { hv = HostDouble(values); }));
  const double* vp = hv.data_ptr<double>();
  // Every value converted before anything is added: a refusal adds nothing.
  std::vector<unsigned __int128> fixed(static_cast<size_t>(tokens * k));
  for (int64_t e = 0; e < tokens * k; ++e) {
    if (!ToFixed(vp[e], &fixed[e])) {
      return absl::OutOfRangeError(absl::StrCat("exact gradients of '", s->name, "': contribution ",
                                                vp[e], " to element ", e % k,
                                                " is not finite or not below 2^", kMaxExponent));
    }
  }
  ReadyHostSums(*s);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < k; ++j) s->sums[j] += fixed[t * k + j];
  }
  Deposited(*s, tokens, /*on_host=*/true);
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> ExactGradients::Sums(int slot) {
  LOCKSTEP_ASSIGN_OR_RETURN(Slot * s, At(slot));
  LOCKSTEP_ASSIGN_OR_RETURN(const at::Tensor sum, Rounded(*s));
  return CallTorch("exact gradients: the sums to the host", [&]() -> absl::StatusOr<at::Tensor> {
    return sum.to(at::kCPU).view(s->parameter.sizes());
  });
}

absl::Status ExactGradients::SumOver(collectives::Communicator* group,
                                     const std::set<std::string>& whole) {
  if (group == nullptr || group->size() == 1) return absl::OkStatus();
  std::vector<Slot*> summed;
  for (Slot& s : slots_) {
    if (!whole.count(s.name)) summed.push_back(&s);
  }
  // Four 32-bit limbs per sum, each in an int64: a member's limbs add without carrying out of
  // their slot (at most 2^31 members), and the carries are taken after the reduction. A CUDA
  // parameter's limbs are made and taken on its device.
  std::vector<at::Tensor> parts;
  for (Slot* s : summed) {
    if (s->parameter.is_cuda()) {
      LOCKSTEP_RETURN_IF_ERROR(Gather(*s));
      LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor * sums, DeviceSums(*s));
      LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor limbs, internal::CudaToLimbs(*sums));
      parts.push_back(std::move(limbs));
      continue;
    }
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: packing the sums", [&] {
      at::Tensor limbs = at::empty({static_cast<int64_t>(s->sums.size()), 4}, at::kLong);
      int64_t* lp = limbs.data_ptr<int64_t>();
      for (unsigned __int128 v : s->sums) {
        for (int l = 0; l < 4; ++l) *lp++ = static_cast<int64_t>((v >> (32 * l)) & 0xFFFFFFFFu);
      }
      parts.push_back(std::move(limbs));
    }));
  }
  // On the parameters' device, where the group's collectives run (a GPU for NCCL).
  at::Tensor reduced;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: to the group's device", [&] {
    const at::Device device = slots_.empty() ? at::Device(at::kCPU) : slots_[0].parameter.device();
    for (at::Tensor& part : parts) part = part.to(device);
    reduced = parts.empty() ? at::empty({0, 4}, at::TensorOptions(device).dtype(at::kLong))
                            : at::cat(parts);
  }));
  LOCKSTEP_RETURN_IF_ERROR(Annotate(group->AllReduceSum(reduced), "summing exact gradients"));
  // The members' contribution counts, summed too: each member bounds its own, and only their
  // total bounds the reduced sums (every member sees the same totals, so all refuse alike).
  at::Tensor terms;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: the contribution counts", [&] {
    terms = at::empty({static_cast<int64_t>(summed.size())}, at::kLong);
    int64_t* tp = terms.data_ptr<int64_t>();
    for (size_t i = 0; i < summed.size(); ++i) tp[i] = summed[i]->terms;
    terms = terms.to(reduced.device());
  }));
  LOCKSTEP_RETURN_IF_ERROR(Annotate(group->AllReduceSum(terms), "summing exact gradient counts"));
  LOCKSTEP_RETURN_IF_ERROR(
      CallTorch("exact gradients: counts to the host", [&] { terms = terms.to(at::kCPU); }));
  const int64_t* tp = terms.data_ptr<int64_t>();
  for (size_t i = 0; i < summed.size(); ++i) {
    if (tp[i] > (int64_t{1} << kMaxTermsLog2)) {
      return absl::OutOfRangeError(
          absl::StrCat("exact gradients of '", summed[i]->name, "': ", tp[i],
                       " contributions per element over the group; the limit is 2^", kMaxTermsLog2,
                       " (the sums may have wrapped)"));
    }
    summed[i]->terms = tp[i];
  }
  int64_t offset = 0;
  for (Slot* s : summed) {
    const int64_t count = s->parameter.numel();
    at::Tensor limbs;
    if (s->parameter.is_cuda()) {
      LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: the reduced limbs", [&] {
        limbs = reduced.narrow(0, offset, count).to(s->parameter.device()).contiguous();
      }));
      LOCKSTEP_RETURN_IF_ERROR(internal::CudaFromLimbs(limbs, s->device_sums));
    } else {
      LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact gradients: the reduced limbs to the host", [&] {
        limbs = reduced.narrow(0, offset, count).to(at::kCPU).contiguous();
      }));
      const int64_t* lp = limbs.data_ptr<int64_t>();
      for (unsigned __int128& v : s->sums) {
        v = 0;
        for (int l = 0; l < 4; ++l) {
          v += static_cast<unsigned __int128>(static_cast<uint64_t>(*lp++)) << (32 * l);
        }
      }
    }
    offset += count;
  }
  return absl::OkStatus();
}

absl::Status ExactGradients::WriteGradients() {
  for (Slot& s : slots_) {
    LOCKSTEP_ASSIGN_OR_RETURN(const at::Tensor sum, Rounded(s));
    LOCKSTEP_RETURN_IF_ERROR(
        CallTorch(absl::StrCat("exact gradients: writing '", s.name, "'"), [&] {
          s.parameter.mutable_grad() =
              sum.view(s.parameter.sizes()).to(s.parameter.scalar_type()).to(s.parameter.device());
        }));
  }
  Zero();
  return absl::OkStatus();
}

void ExactGradients::Zero() {
  for (Slot& s : slots_) {
    if (!s.parameter.is_cuda() || s.host_pending) std::fill(s.sums.begin(), s.sums.end(), 0);
    s.host_pending = false;
    s.device_sums = at::Tensor();
    s.terms = 0;
  }
}

absl::StatusOr<ExactSum> ExactSum::Make() {
  at::Tensor zero;
  LOCKSTEP_RETURN_IF_ERROR(
      CallTorch("exact sum: its element", [&] { zero = at::zeros({1}, at::kDouble); }));
  return ExactSum(ExactGradients({{"sum", zero}}));
}

absl::Status ExactSum::Add(const at::Tensor& values) {
  at::Tensor column;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("exact sum: the values as one column", [&] {
    column = values.reshape({-1, 1}).to(at::kCPU);
  }));
  return sum_.AddColumns(0, column);
}

absl::Status ExactSum::SumOver(collectives::Communicator* group) { return sum_.SumOver(group); }

absl::StatusOr<double> ExactSum::Total() {
  LOCKSTEP_ASSIGN_OR_RETURN(const at::Tensor sums, sum_.Sums(0));
  return sums.data_ptr<double>()[0];
}

void ExactSum::Zero() { sum_.Zero(); }

}  // namespace invariant
}  // namespace lockstep
