#include <algorithm>
#include <cstdint>
#include <vector>

#include "ATen/ATen.h"
#include "base/status_macros.h"
#include "invariant/internal/cuda_kernels.h"
#include "invariant/internal/cuda_launch.h"
#include "invariant/internal/device_ops.h"

namespace lockstep {
namespace invariant {
namespace internal {
namespace {

// `visible` flattened (cuda_kernels.h's DeviceVisibility), copied to `device` in one transfer;
// `arrays` keeps the device copy alive (released to the caching allocator when the caller drops
// it, and reused only by work queued after the kernels on this stream).
struct Flattened {
  at::Tensor arrays;
  DeviceVisibility view{};
  int64_t scratch = 0;  // doubles of each scratch buffer
};

Flattened Flatten(const Visibility& visible, const c10::Device& device) {
  std::vector<int64_t> key_rows, sequence_start, key_index, key_queries_first, key_queries_end,
      sequence_queries, query_start;
  for (const std::vector<int64_t>& queries : visible.sequence_queries) {
    query_start.push_back(static_cast<int64_t>(sequence_queries.size()));
    sequence_queries.insert(sequence_queries.end(), queries.begin(), queries.end());
  }
  for (size_t s = 0; s < visible.sequence_keys.size(); ++s) {
    sequence_start.push_back(static_cast<int64_t>(key_rows.size()));
    const int64_t first = query_start[s];
    const int64_t end = first + static_cast<int64_t>(visible.sequence_queries[s].size());
    for (size_t p = 0; p < visible.sequence_keys[s].size(); ++p) {
      key_rows.push_back(visible.sequence_keys[s][p]);
      key_index.push_back(static_cast<int64_t>(p));
      key_queries_first.push_back(first);
      key_queries_end.push_back(end);
    }
  }
  const int64_t queries = static_cast<int64_t>(visible.sequence.size());
  std::vector<int64_t> query_first(queries), scratch_start(queries + 1, 0);
  for (int64_t i = 0; i < queries; ++i) {
    query_first[i] = sequence_start[visible.sequence[i]];
    scratch_start[i + 1] = scratch_start[i] + visible.count[i];
  }
  const std::vector<const std::vector<int64_t>*> parts = {
      &key_rows,  &query_first,       &visible.count,   &scratch_start,
      &key_index, &key_queries_first, &key_queries_end, &sequence_queries};
  std::vector<int64_t> all;
  std::vector<size_t> offsets;
  for (const std::vector<int64_t>* part : parts) {
    offsets.push_back(all.size());
    all.insert(all.end(), part->begin(), part->end());
  }
  all.push_back(0);  // never empty
  Flattened f;
  f.arrays = at::from_blob(all.data(), {static_cast<int64_t>(all.size())}, at::kLong).to(device);
  const int64_t* base = f.arrays.data_ptr<int64_t>();
  f.view = DeviceVisibility{base + offsets[0], base + offsets[1],
                            base + offsets[2], base + offsets[3],
                            base + offsets[4], base + offsets[5],
                            base + offsets[6], base + offsets[7],
                            queries,           static_cast<int64_t>(key_rows.size())};
  f.scratch = std::max<int64_t>(scratch_start[queries], 1);
  return f;
}

}  // namespace

absl::StatusOr<at::Tensor> CudaLinearRows(const at::Tensor& x, const at::Tensor& w_t) {
  at::Tensor out;
  LOCKSTEP_RETURN_IF_ERROR(
      LaunchOn("the placement-invariant Linear on CUDA", x, [&](cudaStream_t s) {
        out = at::empty({x.size(0), w_t.size(1)}, x.options());
        return LaunchLinearRows(x.data_ptr<double>(), w_t.data_ptr<double>(), x.size(0), x.size(1),
                                w_t.size(1), out.data_ptr<double>(), s);
      }));
  return out;
}

absl::StatusOr<at::Tensor> CudaGeluForward(const at::Tensor& x) {
  at::Tensor out;
  LOCKSTEP_RETURN_IF_ERROR(LaunchOn("the placement-invariant GELU on CUDA", x, [&](cudaStream_t s) {
    out = at::empty_like(x);
    return LaunchGeluForward(x.data_ptr<double>(), x.numel(), out.data_ptr<double>(), s);
  }));
  return out;
}

absl::StatusOr<at::Tensor> CudaGeluBackward(const at::Tensor& x, const at::Tensor& dy) {
  at::Tensor out;
  LOCKSTEP_RETURN_IF_ERROR(
      LaunchOn("the placement-invariant GELU backward on CUDA", x, [&](cudaStream_t s) {
        out = at::empty_like(x);
        return LaunchGeluBackward(x.data_ptr<double>(), dy.data_ptr<double>(), x.numel(),
                                  out.data_ptr<double>(), s);
      }));
  return out;
}

absl::StatusOr<at::Tensor> CudaRowLogSumExp(const at::Tensor& z) {
  at::Tensor out;
  LOCKSTEP_RETURN_IF_ERROR(
      LaunchOn("the placement-invariant log-sum-exp on CUDA", z, [&](cudaStream_t s) {
        out = at::empty({z.size(0)}, z.options());
        return LaunchRowLogSumExp(z.data_ptr<double>(), z.size(0), z.size(1),
                                  out.data_ptr<double>(), s);
      }));
  return out;
}

absl::StatusOr<at::Tensor> CudaRowSoftmax(const at::Tensor& z, const at::Tensor& lse) {
  at::Tensor out;
  LOCKSTEP_RETURN_IF_ERROR(
      LaunchOn("the placement-invariant softmax on CUDA", z, [&](cudaStream_t s) {
        out = at::empty_like(z);
        return LaunchRowSoftmax(z.data_ptr<double>(), lse.data_ptr<double>(), z.size(0), z.size(1),
                                out.data_ptr<double>(), s);
      }));
  return out;
}

absl::StatusOr<at::Tensor> CudaAttentionForward(const Visibility& visible, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& v,
                                                double scale) {
  at::Tensor out;
  LOCKSTEP_RETURN_IF_ERROR(
      LaunchOn("the placement-invariant attention on CUDA", q, [&](cudaStream_t s) {
        const Flattened f = Flatten(visible, q.device());
        const at::Tensor scratch = at::empty({f.scratch}, q.options());
        out = at::empty({q.size(0), v.size(1)}, q.options());
        return LaunchAttentionForward(f.view, q.data_ptr<double>(), k.data_ptr<double>(),
                                      v.data_ptr<double>(), q.size(1), v.size(1), scale,
                                      scratch.data_ptr<double>(), out.data_ptr<double>(), s);
      }));
  return out;
}

absl::StatusOr<AttentionGradients> CudaAttentionBackward(const Visibility& visible,
                                                         const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& v,
                                                         const at::Tensor& dout, double scale) {
  AttentionGradients g;
  LOCKSTEP_RETURN_IF_ERROR(
      LaunchOn("the placement-invariant attention backward on CUDA", q, [&](cudaStream_t s) {
        const Flattened f = Flatten(visible, q.device());
        const at::Tensor probabilities = at::empty({f.scratch}, q.options());
        const at::Tensor score_grads = at::empty({f.scratch}, q.options());
        g = {at::zeros_like(q), at::zeros_like(k), at::zeros_like(v)};
        return LaunchAttentionBackward(f.view, q.data_ptr<double>(), k.data_ptr<double>(),
                                       v.data_ptr<double>(), dout.data_ptr<double>(), q.size(1),
                                       v.size(1), scale, probabilities.data_ptr<double>(),
                                       score_grads.data_ptr<double>(), g.dq.data_ptr<double>(),
                                       g.dk.data_ptr<double>(), g.dv.data_ptr<double>(), s);
      }));
  return g;
}

}  // namespace internal
}  // namespace invariant
}  // namespace lockstep
