#include "invariant/internal/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "absl/strings/str_cat.h"

namespace lockstep {
namespace invariant {
namespace internal {
namespace {

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

// One query's scores' exponentials (relative to their maximum) and their sum, over its visible
// keys in increasing position.
struct Weights {
  std::vector<double> e;
  double sum = 0;
};

Weights QueryWeights(const Visibility& visible, int64_t i, const double* q, const double* k,
                     int64_t d, double scale) {
  const std::vector<int64_t>& keys = visible.sequence_keys[visible.sequence[i]];
  const int64_t n = visible.count[i];
  Weights w;
  w.e.resize(n);
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    const double* key = k + keys[j] * d;
    const double* query = q + i * d;
    double dot = 0;
    for (int64_t c = 0; c < d; ++c) dot += query[c] * key[c];
    w.e[j] = dot * scale;
    max = std::max(max, w.e[j]);
  }
  for (int64_t j = 0; j < n; ++j) {
    w.e[j] = std::exp(w.e[j] - max);
    w.sum += w.e[j];
  }
  return w;
}

}  // namespace

at::Tensor LinearRows(const at::Tensor& x, const at::Tensor& w_t) {
  const int64_t m = x.size(0), k = x.size(1), n = w_t.size(1);
  at::Tensor out = at::zeros({m, n}, x.options());
  const double* xp = x.data_ptr<double>();
  const double* wp = w_t.data_ptr<double>();
  double* op = out.data_ptr<double>();
  // Rows are independent: the split over threads changes no element's order of additions.
  at::parallel_for(0, m, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      double* acc = op + r * n;
      for (int64_t j = 0; j < k; ++j) {
        const double a = xp[r * k + j];
        const double* row = wp + j * n;
        for (int64_t c = 0; c < n; ++c) acc[c] += a * row[c];
      }
    }
  });
  return out;
}

at::Tensor RowLogSumExp(const at::Tensor& z) {
  const int64_t m = z.size(0), v = z.size(1);
  at::Tensor out = at::empty({m}, z.options());
  const double* zp = z.data_ptr<double>();
  double* op = out.data_ptr<double>();
  at::parallel_for(0, m, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const double* row = zp + r * v;
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t c = 0; c < v; ++c) max = std::max(max, row[c]);
      double sum = 0;
      for (int64_t c = 0; c < v; ++c) sum += std::exp(row[c] - max);
      op[r] = max + std::log(sum);
    }
  });
  return out;
}

at::Tensor RowSoftmax(const at::Tensor& z, const at::Tensor& lse) {
  const int64_t v = z.size(1);
  at::Tensor out = at::empty_like(z);
  const double* zp = z.data_ptr<double>();
  const double* lp = lse.data_ptr<double>();
  double* op = out.data_ptr<double>();
  at::parallel_for(0, z.numel(), 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) op[i] = std::exp(zp[i] - lp[i / v]);
  });
  return out;
}

at::Tensor GeluForward(const at::Tensor& x) {
  at::Tensor out = at::empty_like(x);
  const double* xp = x.data_ptr<double>();
  double* op = out.data_ptr<double>();
  at::parallel_for(0, x.numel(), 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) op[i] = 0.5 * xp[i] * (1.0 + std::erf(xp[i] * kInvSqrt2));
  });
  return out;
}

at::Tensor GeluBackward(const at::Tensor& x, const at::Tensor& dy) {
  at::Tensor out = at::empty_like(x);
  const double* xp = x.data_ptr<double>();
  const double* gp = dy.data_ptr<double>();
  double* op = out.data_ptr<double>();
  at::parallel_for(0, x.numel(), 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const double v = xp[i];
      const double cdf = 0.5 * (1.0 + std::erf(v * kInvSqrt2));
      op[i] = gp[i] * (cdf + v * kInvSqrt2Pi * std::exp(-0.5 * v * v));
    }
  });
  return out;
}

absl::StatusOr<Visibility> SeeKeys(const at::Tensor& query_tokens, const at::Tensor& key_tokens) {
  const auto queries = query_tokens.accessor<int64_t, 2>();
  const auto keys = key_tokens.accessor<int64_t, 2>();
  // Per sequence id: its keys as (position, row), then sorted.
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> by_id;
  for (int64_t r = 0; r < keys.size(0); ++r) {
    if (keys[r][0] >= 0) by_id[keys[r][0]].emplace_back(keys[r][1], r);
  }
  Visibility visible;
  std::map<int64_t, int64_t> index;  // sequence id -> its index in visible.sequence_keys
  std::vector<std::vector<int64_t>> positions;
  for (auto& [id, rows] : by_id) {
    std::sort(rows.begin(), rows.end());
    std::vector<int64_t> sorted_rows, sorted_positions;
    for (size_t j = 0; j < rows.size(); ++j) {
      if (j > 0 && rows[j].first == rows[j - 1].first) {
        return absl::InvalidArgumentError(
            absl::StrCat("placement-invariant attention: keys ", rows[j - 1].second, " and ",
                         rows[j].second, " are both sequence ", id, "'s position ", rows[j].first));
      }
      sorted_rows.push_back(rows[j].second);
      sorted_positions.push_back(rows[j].first);
    }
    index[id] = static_cast<int64_t>(visible.sequence_keys.size());
    visible.sequence_keys.push_back(std::move(sorted_rows));
    positions.push_back(std::move(sorted_positions));
  }
  const int64_t n = queries.size(0);
  visible.sequence.resize(n);
  visible.count.resize(n);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> queries_of(visible.sequence_keys.size());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = queries[i][0], position = queries[i][1];
    auto found = index.find(id);
    const int64_t seen = found == index.end()
                             ? 0
                             : std::upper_bound(positions[found->second].begin(),
                                                positions[found->second].end(), position) -
                                   positions[found->second].begin();
    if (seen == 0) {
      return absl::InvalidArgumentError(absl::StrCat("placement-invariant attention: query ", i,
                                                     " (sequence ", id, ", position ", position,
                                                     ") sees no key"));
    }
    visible.sequence[i] = found->second;
    visible.count[i] = seen;
    queries_of[found->second].emplace_back(position, i);
  }
  for (auto& rows : queries_of) {
    std::sort(rows.begin(), rows.end());
    std::vector<int64_t> sorted;
    for (const auto& [position, row] : rows) sorted.push_back(row);
    visible.sequence_queries.push_back(std::move(sorted));
  }
  return visible;
}

at::Tensor AttentionForward(const Visibility& visible, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, double scale) {
  const int64_t mq = q.size(0), d = q.size(1), dv = v.size(1);
  at::Tensor out = at::zeros({mq, dv}, q.options());
  const double* qp = q.data_ptr<double>();
  const double* kp = k.data_ptr<double>();
  const double* vp = v.data_ptr<double>();
  double* op = out.data_ptr<double>();
  at::parallel_for(0, mq, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Weights w = QueryWeights(visible, i, qp, kp, d, scale);
      const std::vector<int64_t>& keys = visible.sequence_keys[visible.sequence[i]];
      double* row = op + i * dv;
      for (size_t j = 0; j < w.e.size(); ++j) {
        const double* value = vp + keys[j] * dv;
        for (int64_t c = 0; c < dv; ++c) row[c] += w.e[j] * value[c];
      }
      for (int64_t c = 0; c < dv; ++c) row[c] /= w.sum;
    }
  });
  return out;
}

AttentionGradients AttentionBackward(const Visibility& visible, const at::Tensor& q,
                                     const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& dout, double scale) {
  const int64_t mq = q.size(0), d = q.size(1), dv = v.size(1);
  AttentionGradients g{at::zeros_like(q), at::zeros_like(k), at::zeros_like(v)};
  const double* qp = q.data_ptr<double>();
  const double* kp = k.data_ptr<double>();
  const double* vp = v.data_ptr<double>();
  const double* gp = dout.data_ptr<double>();
  // Per query: the probabilities P_j and dS_j = P_j (dP_j - sum_j P_j dP_j), dP_j = dout . v_j.
  std::vector<std::vector<double>> p(mq), ds(mq);
  double* dq = g.dq.data_ptr<double>();
  at::parallel_for(0, mq, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Weights w = QueryWeights(visible, i, qp, kp, d, scale);
      const std::vector<int64_t>& keys = visible.sequence_keys[visible.sequence[i]];
      const double* grad = gp + i * dv;
      const size_t n = w.e.size();
      p[i].resize(n);
      ds[i].resize(n);
      double expected = 0;  // sum_j P_j dP_j
      for (size_t j = 0; j < n; ++j) {
        p[i][j] = w.e[j] / w.sum;
        const double* value = vp + keys[j] * dv;
        double dp = 0;
        for (int64_t c = 0; c < dv; ++c) dp += grad[c] * value[c];
        ds[i][j] = dp;
        expected += p[i][j] * dp;
      }
      double* row = dq + i * d;
      for (size_t j = 0; j < n; ++j) {
        ds[i][j] = p[i][j] * (ds[i][j] - expected);
        const double* key = kp + keys[j] * d;
        for (int64_t c = 0; c < d; ++c) row[c] += ds[i][j] * scale * key[c];
      }
    }
  });
  // dk and dv: each key's sum over its sequence's queries in increasing position. Sequences own
  // disjoint keys, so they run in parallel.
  double* dk = g.dk.data_ptr<double>();
  double* dvp = g.dv.data_ptr<double>();
  const int64_t sequences = static_cast<int64_t>(visible.sequence_keys.size());
  at::parallel_for(0, sequences, 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      const std::vector<int64_t>& keys = visible.sequence_keys[s];
      for (int64_t i : visible.sequence_queries[s]) {
        const double* query = qp + i * d;
        const double* grad = gp + i * dv;
        for (int64_t j = 0; j < visible.count[i]; ++j) {
          double* key_grad = dk + keys[j] * d;
          double* value_grad = dvp + keys[j] * dv;
          for (int64_t c = 0; c < d; ++c) key_grad[c] += ds[i][j] * scale * query[c];
          for (int64_t c = 0; c < dv; ++c) value_grad[c] += p[i][j] * grad[c];
        }
      }
    }
  });
  return g;
}

}  // namespace internal
}  // namespace invariant
}  // namespace lockstep
