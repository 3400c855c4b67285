#include "invariant/internal/cuda_kernels.h"

namespace lockstep {
namespace invariant {
namespace internal {
namespace {

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr int kWarpsPerBlock = 4;
constexpr unsigned kAll = 0xFFFFFFFFu;

// a + b * c as two rounded operations (cpu_kernels.cc's `acc += b * c`).
__device__ __forceinline__ double AddProduct(double a, double b, double c) {
  return __dadd_rn(a, __dmul_rn(b, c));
}

__device__ double Dot(const double* a, const double* b, int64_t n) {
  double acc = 0;
  for (int64_t c = 0; c < n; ++c) acc = AddProduct(acc, a[c], b[c]);
  return acc;
}

// Block: columns [x * kLinearColumns, +kLinearColumns) of rows [y * kLinearRows, +kLinearRows),
// staged kLinearDepth at a time in shared memory; thread (tx, ty): column tx of rows
// ty * kRowsPerThread + r. Each output's sum runs over j in increasing order, as the CPU's.
constexpr int kLinearColumns = 32;
constexpr int kThreadRows = 8;
constexpr int kRowsPerThread = 8;
constexpr int kLinearRows = kThreadRows * kRowsPerThread;
constexpr int kLinearDepth = 16;

__global__ void LinearRowsKernel(const double* __restrict__ x, const double* __restrict__ w_t,
                                 int64_t m, int64_t k, int64_t n, double* __restrict__ out) {
  __shared__ double sx[kLinearRows][kLinearDepth];
  __shared__ double sw[kLinearDepth][kLinearColumns];
  const int tx = threadIdx.x, ty = threadIdx.y, thread = ty * kLinearColumns + tx;
  constexpr int kThreads = kLinearColumns * kThreadRows;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kLinearColumns + tx;
  const int64_t row_blocks = (m + kLinearRows - 1) / kLinearRows;
  for (int64_t rb = blockIdx.y; rb < row_blocks; rb += gridDim.y) {
    const int64_t row0 = rb * kLinearRows;
    double acc[kRowsPerThread] = {};
    for (int64_t j0 = 0; j0 < k; j0 += kLinearDepth) {
      for (int e = thread; e < kLinearRows * kLinearDepth; e += kThreads) {
        const int r = e / kLinearDepth, jj = e % kLinearDepth;
        const bool live = row0 + r < m && j0 + jj < k;
        sx[r][jj] = live ? x[(row0 + r) * k + j0 + jj] : 0.0;
      }
      for (int e = thread; e < kLinearDepth * kLinearColumns; e += kThreads) {
        const int jj = e / kLinearColumns, c = e % kLinearColumns;
        const int64_t column = static_cast<int64_t>(blockIdx.x) * kLinearColumns + c;
        sw[jj][c] = j0 + jj < k && column < n ? w_t[(j0 + jj) * n + column] : 0.0;
      }
      __syncthreads();
      const int depth = k - j0 < kLinearDepth ? static_cast<int>(k - j0) : kLinearDepth;
      for (int jj = 0; jj < depth; ++jj) {
        const double w = sw[jj][tx];
#pragma unroll
        for (int r = 0; r < kRowsPerThread; ++r) {
          acc[r] = AddProduct(acc[r], sx[ty * kRowsPerThread + r][jj], w);
        }
      }
      __syncthreads();
    }
    if (col < n) {
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int64_t row = row0 + ty * kRowsPerThread + r;
        if (row < m) out[row * n + col] = acc[r];
      }
    }
  }
}

__global__ void GeluForwardKernel(const double* __restrict__ x, int64_t count,
                                  double* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double v = x[i];
    out[i] = __dmul_rn(__dmul_rn(0.5, v), __dadd_rn(1.0, erf(__dmul_rn(v, kInvSqrt2))));
  }
}

__global__ void GeluBackwardKernel(const double* __restrict__ x, const double* __restrict__ dy,
                                   int64_t count, double* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double v = x[i];
    const double cdf = __dmul_rn(0.5, __dadd_rn(1.0, erf(__dmul_rn(v, kInvSqrt2))));
    const double density =
        __dmul_rn(__dmul_rn(v, kInvSqrt2Pi), exp(__dmul_rn(__dmul_rn(-0.5, v), v)));
    out[i] = __dmul_rn(dy[i], __dadd_rn(cdf, density));
  }
}

// One thread per row, its sum in increasing column (cpu_kernels.cc's RowLogSumExp).
__global__ void RowLogSumExpKernel(const double* __restrict__ z, int64_t m, int64_t v,
                                   double* __restrict__ lse) {
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < m;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double* row = z + r * v;
    double max = -INFINITY;
    for (int64_t c = 0; c < v; ++c) max = fmax(max, row[c]);
    double sum = 0;
    for (int64_t c = 0; c < v; ++c) sum = __dadd_rn(sum, exp(__dsub_rn(row[c], max)));
    lse[r] = __dadd_rn(max, log(sum));
  }
}

__global__ void RowSoftmaxKernel(const double* __restrict__ z, const double* __restrict__ lse,
                                 int64_t count, int64_t v, double* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = exp(__dsub_rn(z[i], lse[i / v]));
  }
}

// One warp per query: its scores' exponentials (relative to their maximum) into e[0, count), and
// their sum, added in increasing position by lane 0 (returned to every lane).
__device__ double QueryWeights(const DeviceVisibility& visible, int64_t i, const double* q,
                               const double* k, int64_t d, double scale, double* e, int lane) {
  const int64_t first = visible.query_first[i], count = visible.query_count[i];
  double max = -INFINITY;
  for (int64_t p = lane; p < count; p += 32) {
    const double s = __dmul_rn(Dot(q + i * d, k + visible.key_rows[first + p] * d, d), scale);
    e[p] = s;
    max = fmax(max, s);
  }
  for (int offset = 16; offset > 0; offset /= 2)
    max = fmax(max, __shfl_xor_sync(kAll, max, offset));
  for (int64_t p = lane; p < count; p += 32) e[p] = exp(__dsub_rn(e[p], max));
  __syncwarp();
  double sum = 0;
  if (lane == 0) {
    for (int64_t p = 0; p < count; ++p) sum = __dadd_rn(sum, e[p]);
  }
  return __shfl_sync(kAll, sum, 0);
}

__global__ void AttentionForwardKernel(DeviceVisibility visible, const double* __restrict__ q,
                                       const double* __restrict__ k, const double* __restrict__ v,
                                       int64_t d, int64_t dv, double scale, double* scratch,
                                       double* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (i >= visible.queries) return;  // the whole warp: i is the warp's
  const int lane = threadIdx.x % 32;
  double* e = scratch + visible.scratch_start[i];
  const double sum = QueryWeights(visible, i, q, k, d, scale, e, lane);
  const int64_t first = visible.query_first[i], count = visible.query_count[i];
  for (int64_t c = lane; c < dv; c += 32) {
    double acc = 0;
    for (int64_t p = 0; p < count; ++p)
      acc = AddProduct(acc, e[p], v[visible.key_rows[first + p] * dv + c]);
    out[i * dv + c] = __ddiv_rn(acc, sum);
  }
}

// Per query: P, dS = P (dP - sum P dP) with dP = dout . v, and dq.
__global__ void AttentionQueryGradKernel(DeviceVisibility visible, const double* __restrict__ q,
                                         const double* __restrict__ k, const double* __restrict__ v,
                                         const double* __restrict__ dout, int64_t d, int64_t dv,
                                         double scale, double* probabilities, double* score_grads,
                                         double* __restrict__ dq) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (i >= visible.queries) return;
  const int lane = threadIdx.x % 32;
  double* prob = probabilities + visible.scratch_start[i];
  double* ds = score_grads + visible.scratch_start[i];
  const double sum = QueryWeights(visible, i, q, k, d, scale, prob, lane);
  const int64_t first = visible.query_first[i], count = visible.query_count[i];
  for (int64_t p = lane; p < count; p += 32) {
    prob[p] = __ddiv_rn(prob[p], sum);
    ds[p] = Dot(dout + i * dv, v + visible.key_rows[first + p] * dv, dv);
  }
  __syncwarp();
  double expected = 0;
  if (lane == 0) {
    for (int64_t p = 0; p < count; ++p) expected = AddProduct(expected, prob[p], ds[p]);
  }
  expected = __shfl_sync(kAll, expected, 0);
  for (int64_t p = lane; p < count; p += 32) ds[p] = __dmul_rn(prob[p], __dsub_rn(ds[p], expected));
  __syncwarp();
  for (int64_t c = lane; c < d; c += 32) {
    double acc = 0;
    for (int64_t p = 0; p < count; ++p) {
      acc = AddProduct(acc, __dmul_rn(ds[p], scale), k[visible.key_rows[first + p] * d + c]);
    }
    dq[i * d + c] = acc;
  }
}

// Per key: dk and dv summed over its sequence's queries that see it, in increasing position.
__global__ void AttentionKeyGradKernel(DeviceVisibility visible, const double* __restrict__ q,
                                       const double* __restrict__ dout, int64_t d, int64_t dv,
                                       double scale, const double* probabilities,
                                       const double* score_grads, double* __restrict__ dk,
                                       double* __restrict__ dv_out) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (g >= visible.keys) return;
  const int lane = threadIdx.x % 32;
  const int64_t row = visible.key_rows[g], p = visible.key_index[g];
  for (int64_t c = lane; c < d; c += 32) {
    double acc = 0;
    for (int64_t t = visible.key_queries_first[g]; t < visible.key_queries_end[g]; ++t) {
      const int64_t i = visible.sequence_queries[t];
      if (p >= visible.query_count[i]) continue;
      acc = AddProduct(acc, __dmul_rn(score_grads[visible.scratch_start[i] + p], scale),
                       q[i * d + c]);
    }
    dk[row * d + c] = acc;
  }
  for (int64_t c = lane; c < dv; c += 32) {
    double acc = 0;
    for (int64_t t = visible.key_queries_first[g]; t < visible.key_queries_end[g]; ++t) {
      const int64_t i = visible.sequence_queries[t];
      if (p >= visible.query_count[i]) continue;
      acc = AddProduct(acc, probabilities[visible.scratch_start[i] + p], dout[i * dv + c]);
    }
    dv_out[row * dv + c] = acc;
  }
}

unsigned Blocks(int64_t items, int64_t per_block, int64_t limit) {
  const int64_t blocks = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < limit ? blocks : limit);
}

}  // namespace

cudaError_t LaunchLinearRows(const double* x, const double* w_t, int64_t m, int64_t k, int64_t n,
                             double* out, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  const dim3 threads(kLinearColumns, kThreadRows);
  const dim3 blocks(Blocks(n, kLinearColumns, 2147483647), Blocks(m, kLinearRows, 65535));
  LinearRowsKernel<<<blocks, threads, 0, stream>>>(x, w_t, m, k, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchGeluForward(const double* x, int64_t count, double* out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  GeluForwardKernel<<<Blocks(count, 256, 65536), 256, 0, stream>>>(x, count, out);
  return cudaGetLastError();
}

cudaError_t LaunchGeluBackward(const double* x, const double* dy, int64_t count, double* out,
                               cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  GeluBackwardKernel<<<Blocks(count, 256, 65536), 256, 0, stream>>>(x, dy, count, out);
  return cudaGetLastError();
}

cudaError_t LaunchRowLogSumExp(const double* z, int64_t m, int64_t v, double* lse,
                               cudaStream_t stream) {
  if (m == 0) return cudaSuccess;
  RowLogSumExpKernel<<<Blocks(m, 128, 65536), 128, 0, stream>>>(z, m, v, lse);
  return cudaGetLastError();
}

cudaError_t LaunchRowSoftmax(const double* z, const double* lse, int64_t m, int64_t v, double* out,
                             cudaStream_t stream) {
  if (m == 0 || v == 0) return cudaSuccess;
  RowSoftmaxKernel<<<Blocks(m * v, 256, 65536), 256, 0, stream>>>(z, lse, m * v, v, out);
  return cudaGetLastError();
}

cudaError_t LaunchAttentionForward(const DeviceVisibility& visible, const double* q,
                                   const double* k, const double* v, int64_t d, int64_t dv,
                                   double scale, double* scratch, double* out,
                                   cudaStream_t stream) {
  if (visible.queries == 0) return cudaSuccess;
  AttentionForwardKernel<<<Blocks(visible.queries, kWarpsPerBlock, 2147483647), 32 * kWarpsPerBlock,
                           0, stream>>>(visible, q, k, v, d, dv, scale, scratch, out);
  return cudaGetLastError();
}

cudaError_t LaunchAttentionBackward(const DeviceVisibility& visible, const double* q,
                                    const double* k, const double* v, const double* dout, int64_t d,
                                    int64_t dv, double scale, double* probabilities,
                                    double* score_grads, double* dq, double* dk, double* dv_out,
                                    cudaStream_t stream) {
  if (visible.queries == 0) return cudaSuccess;
  AttentionQueryGradKernel<<<Blocks(visible.queries, kWarpsPerBlock, 2147483647),
                             32 * kWarpsPerBlock, 0, stream>>>(visible, q, k, v, dout, d, dv, scale,
                                                               probabilities, score_grads, dq);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess || visible.keys == 0) return error;
  AttentionKeyGradKernel<<<Blocks(visible.keys, kWarpsPerBlock, 2147483647), 32 * kWarpsPerBlock, 0,
                           stream>>>(visible, q, dout, d, dv, scale, probabilities, score_grads, dk,
                                     dv_out);
  return cudaGetLastError();
}

}  // namespace internal
}  // namespace invariant
}  // namespace lockstep
