// invariant/internal/exact_kernels.h
//
// ExactGradients' deposits (invariant/exact_gradients.h, Note [Exact accumulation]) as CUDA
// kernels, into sums kept on the device: two 64-bit words per element (low, then high) of a two's
// complement 128-bit integer, a multiple of 2^-kFractionBits. Each contribution is rounded by the
// integer arithmetic of exact_gradients.cc (Note [Products as integers]), so the sums hold the
// bits the host's would; they are added with atomics (integer addition: any order gives the same
// bits). Range checks are the caller's, before launching: these add whatever they are given.
// Plain C++ interface, so nvcc never parses LibTorch.

#ifndef LOCKSTEP_INVARIANT_INTERNAL_EXACT_KERNELS_H_
#define LOCKSTEP_INVARIANT_INTERNAL_EXACT_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lockstep {
namespace invariant {
namespace internal {

// sums[n, k] += sum over t of a[t, n] * b[t, k], for float32 a [tokens, n] and b [tokens, k]
// (contiguous), each product rounded to a multiple of 2^-fraction_bits.
cudaError_t LaunchAddOuterProducts(const float* a, const float* b, int64_t tokens, int64_t n,
                                   int64_t k, int fraction_bits, unsigned long long* sums,
                                   cudaStream_t stream);

// sums[rows[t], c] += values[t, c] for float64 values [tokens, k], each rounded to a multiple of
// 2^-fraction_bits.
cudaError_t LaunchAddRows(const int64_t* rows, const double* values, int64_t tokens, int64_t k,
                          int fraction_bits, unsigned long long* sums, cudaStream_t stream);

// sums[c] += sum over t of values[t, c], for float64 values [tokens, k], each rounded so.
cudaError_t LaunchAddColumns(const double* values, int64_t tokens, int64_t k, int fraction_bits,
                             unsigned long long* sums, cudaStream_t stream);

// sums[e] += addend[e] for `count` elements (128-bit words, as sums).
cudaError_t LaunchAddWords(const unsigned long long* addend, int64_t count,
                           unsigned long long* sums, cudaStream_t stream);

// Each of `count` sums as four 32-bit limbs, least significant first, each in an int64
// (limbs[4 e + l]), so that a group's limbs add without carrying out of their int64 (an integer
// all-reduce); FromLimbs takes the carries after it: sums[e] = sum of limbs[4 e + l] << 32 l.
cudaError_t LaunchToLimbs(const unsigned long long* sums, int64_t count, int64_t* limbs,
                          cudaStream_t stream);
cudaError_t LaunchFromLimbs(const int64_t* limbs, int64_t count, unsigned long long* sums,
                            cudaStream_t stream);

// Each of `count` sums as a float64, sums[e] * 2^-fraction_bits rounded to nearest (ties to
// even): the host's conversion of a two's complement __int128, bit for bit.
cudaError_t LaunchToDouble(const unsigned long long* sums, int64_t count, int fraction_bits,
                           double* out, cudaStream_t stream);

}  // namespace internal
}  // namespace invariant
}  // namespace lockstep

#endif  // LOCKSTEP_INVARIANT_INTERNAL_EXACT_KERNELS_H_
