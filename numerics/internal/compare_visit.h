// numerics/internal/compare_visit.h
//
// Private to numerics/: the per-element rule of numerics/compare.h and the partial figures it
// accumulates, shared by the CPU loop (compare.cc) and the CUDA kernel (compare_kernel.cu) so
// that both compute exactly the same thing. An element pair is "settled" (passes whatever the
// tolerance) when equal, or both NaN under nan_equal; an unsettled pair with a NaN or an infinity
// fails with infinite difference and ratio; otherwise it fails when |a - b| > atol + rtol |b|.

#ifndef LOCKSTEP_NUMERICS_INTERNAL_COMPARE_VISIT_H_
#define LOCKSTEP_NUMERICS_INTERNAL_COMPARE_VISIT_H_

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define LOCKSTEP_COMPARE_HD __host__ __device__
#else
#define LOCKSTEP_COMPARE_HD
#endif

namespace lockstep {
namespace numerics {
namespace internal {

struct ComparePartial {
  int64_t over = 0;             // elements failing the elementwise criterion
  int64_t bit_differs = 0;      // elements whose bytes differ
  int64_t first_over = -1;      // smallest failing index, or -1
  int64_t first_bit_diff = -1;  // smallest bitwise-differing index, or -1
  int64_t nonfinite = 0;        // unsettled pairs with a NaN or an infinity
  double max_diff = 0;
  double max_ratio = 0;
  double sum_diff2 = 0;  // sum of (a - b)^2 over unsettled finite pairs
  double sum_b2 = 0;     // sum of b^2 over every pair but settled NaN ones
};

struct CompareParams {
  double atol;
  double rtol;
  bool nan_equal;
};

LOCKSTEP_COMPARE_HD inline int64_t MinIndex(int64_t x, int64_t y) {
  if (x < 0) return y;
  if (y < 0) return x;
  return x < y ? x : y;
}

LOCKSTEP_COMPARE_HD inline void MergePartial(ComparePartial& into, const ComparePartial& p) {
  into.over += p.over;
  into.bit_differs += p.bit_differs;
  into.first_over = MinIndex(into.first_over, p.first_over);
  into.first_bit_diff = MinIndex(into.first_bit_diff, p.first_bit_diff);
  into.nonfinite += p.nonfinite;
  into.max_diff = into.max_diff > p.max_diff ? into.max_diff : p.max_diff;
  into.max_ratio = into.max_ratio > p.max_ratio ? into.max_ratio : p.max_ratio;
  into.sum_diff2 += p.sum_diff2;
  into.sum_b2 += p.sum_b2;
}

// Element `i` with values x (actual) and y (expected) as doubles and their bytes' equality.
LOCKSTEP_COMPARE_HD inline void VisitElement(double x, double y, bool bits_equal, int64_t i,
                                             const CompareParams& params, ComparePartial& p) {
  if (!bits_equal) {
    ++p.bit_differs;
    if (p.first_bit_diff < 0) p.first_bit_diff = i;
  }
  const bool settled = x == y || (params.nan_equal && x != x && y != y);
  if (!(settled && y != y)) p.sum_b2 += y * y;
  if (settled) return;
  if (!(x - x == 0) || !(y - y == 0)) {  // a NaN or an infinity
    ++p.nonfinite;
    ++p.over;
    if (p.first_over < 0) p.first_over = i;
    p.max_diff = HUGE_VAL;
    p.max_ratio = HUGE_VAL;
    return;
  }
  const double diff = x > y ? x - y : y - x;
  const double allowed = params.atol + params.rtol * (y < 0 ? -y : y);
  p.sum_diff2 += diff * diff;
  if (diff > p.max_diff) p.max_diff = diff;
  if (allowed > 0) {
    // Note [Dividing only for a new maximum]: a double division costs far more than the rest of
    // an element's work, and once the largest ratio so far is known almost no element exceeds it.
    // Rounding is monotonic, so diff / allowed rounds above max_ratio only if the exact ratio is
    // above it, i.e. only if diff > max_ratio * allowed exactly; bound = max_ratio * allowed
    // rounded is within half an ulp of that product when it is a normal double, so any diff at
    // most bound * (1 - 2^-51) cannot set a new maximum and the division is skipped. (A subnormal
    // or zero bound always divides.) The result is the division's, bit for bit.
    const double bound = p.max_ratio * allowed;
    if (!(bound >= 2.2250738585072014e-308) || diff > bound * (1 - 0x1p-51)) {
      const double ratio = diff / allowed;
      if (ratio > p.max_ratio) p.max_ratio = ratio;
    }
  } else if (diff > 0) {
    p.max_ratio = HUGE_VAL;
  }
  if (diff > allowed) {
    ++p.over;
    if (p.first_over < 0) p.first_over = i;
  }
}

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_INTERNAL_COMPARE_VISIT_H_
