#include "rng/philox.h"

#include <cmath>
#include <type_traits>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "ATen/core/grad_mode.h"
#include "absl/strings/str_cat.h"
#include "base/torch_boundary.h"
#include "rng/internal/philox_box.h"
#include "rng/internal/philox_cuda.h"

namespace lockstep {
namespace rng {
namespace {

constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;
constexpr uint32_t kWeyl1 = 0xBB67AE85u;

inline void Round(uint32_t& c0, uint32_t& c1, uint32_t& c2, uint32_t& c3, uint32_t k0,
                  uint32_t k1) {
  const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
  const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
  const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
  const uint32_t n1 = static_cast<uint32_t>(p1);
  const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
  const uint32_t n3 = static_cast<uint32_t>(p0);
  c0 = n0;
  c1 = n1;
  c2 = n2;
  c3 = n3;
}

inline void Philox(uint32_t c[4], uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    Round(c[0], c[1], c[2], c[3], k0, k1);
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
}

constexpr float kTwoToMinus24 = 1.0f / 16777216.0f;

inline float ToUniform(uint32_t word) { return static_cast<float>(word >> 8) * kTwoToMinus24; }

// Calls emit(output_index, word) for every element of the box, in parallel chunks.
template <typename Emit>
void ForEachElement(const PhiloxKey& key, absl::Span<const int64_t> shape,
                    const std::vector<int64_t>& strides, absl::Span<const Slice> box, Emit emit) {
  const int dims = static_cast<int>(shape.size());
  int64_t total = 1;
  for (const Slice& s : box) total *= s.end - s.begin;
  if (total == 0) return;
  const int64_t run = dims == 0 ? 1 : box[dims - 1].end - box[dims - 1].begin;
  const uint32_t k0 = static_cast<uint32_t>(key.seed);
  const uint32_t k1 = static_cast<uint32_t>(key.seed >> 32);
  at::parallel_for(0, total, 1 << 15, [&](int64_t begin, int64_t end) {
    int64_t o = begin;
    while (o < end) {
      // Global index of output element o: decompose its run index over the outer dimensions.
      int64_t run_index = o / run;
      const int64_t within = o % run;
      int64_t global = dims == 0 ? 0 : box[dims - 1].begin + within;
      for (int d = dims - 2; d >= 0; --d) {
        const int64_t extent = box[d].end - box[d].begin;
        global += (box[d].begin + run_index % extent) * strides[d];
        run_index /= extent;
      }
      const int64_t stop = std::min(end, o + (run - within));
      // Walk Philox blocks across [global, global + (stop - o)).
      while (o < stop) {
        const uint64_t block = static_cast<uint64_t>(global) >> 2;
        uint32_t c[4] = {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), key.step,
                         key.stream};
        Philox(c, k0, k1);
        for (int lane = static_cast<int>(global & 3); lane < 4 && o < stop; ++lane) {
          emit(o, c[lane]);
          ++o;
          ++global;
        }
      }
    }
  });
}

absl::Status CheckDevice(const c10::Device& device) {
  if (device.is_cpu() || device.is_cuda()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("partitioned randomness runs on CPU or CUDA, not ", device.str()));
}

absl::Status CheckP(double p) {
  if (!(p >= 0.0 && p < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dropout probability ", p, " is outside [0, 1)"));
  }
  return absl::OkStatus();
}

// Philox's threshold form of `u >= p` on 24-bit words: keep iff (word >> 8) >= ceil(p * 2^24).
uint32_t KeepThreshold(double p) { return static_cast<uint32_t>(std::ceil(p * 16777216.0)); }

}  // namespace

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
  Philox(counter.data(), key[0], key[1]);
  return counter;
}

absl::StatusOr<at::Tensor> PartitionedUniform(const PhiloxKey& key,
                                              absl::Span<const int64_t> global_shape,
                                              absl::Span<const Slice> box, c10::Device device) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  absl::StatusOr<std::vector<int64_t>> strides = internal::CheckBox(global_shape, box);
  if (!strides.ok()) return strides.status();
  if (device.is_cuda()) return internal::CudaPhilox(key, *strides, box, device);
  at::Tensor out;
  absl::Status status = CallTorch("partitioned uniform", [&] {
    out = at::empty(internal::BoxShape(box), at::kFloat);
    float* data = out.data_ptr<float>();
    ForEachElement(key, global_shape, *strides, box,
                   [data](int64_t o, uint32_t word) { data[o] = ToUniform(word); });
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<at::Tensor> PartitionedDropoutMask(const PhiloxKey& key,
                                                  absl::Span<const int64_t> global_shape,
                                                  absl::Span<const Slice> box, double p,
                                                  c10::Device device) {
  if (absl::Status s = CheckP(p); !s.ok()) return s;
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  if (device.is_cuda()) {
    absl::StatusOr<at::Tensor> uniform = PartitionedUniform(key, global_shape, box, device);
    if (!uniform.ok()) return uniform;
    return CallTorch("dropout mask", [&] {
      return absl::StatusOr<at::Tensor>(*uniform >=
                                        static_cast<float>(KeepThreshold(p) * kTwoToMinus24));
    });
  }
  absl::StatusOr<std::vector<int64_t>> strides = internal::CheckBox(global_shape, box);
  if (!strides.ok()) return strides.status();
  const uint32_t threshold = KeepThreshold(p);
  at::Tensor out;
  absl::Status status = CallTorch("partitioned dropout mask", [&] {
    out = at::empty(internal::BoxShape(box), at::kBool);
    bool* data = out.data_ptr<bool>();
    ForEachElement(key, global_shape, *strides, box, [data, threshold](int64_t o, uint32_t word) {
      data[o] = (word >> 8) >= threshold;
    });
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<at::Tensor> PartitionedDropout(const at::Tensor& shard, const PhiloxKey& key,
                                              absl::Span<const int64_t> global_shape,
                                              absl::Span<const Slice> box, double p) {
  if (absl::Status s = CheckP(p); !s.ok()) return s;
  absl::StatusOr<std::vector<int64_t>> strides = internal::CheckBox(global_shape, box);
  if (!strides.ok()) return strides.status();
  if (!shard.defined() || shard.sizes().vec() != internal::BoxShape(box)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard shape [", shard.defined() ? c10::str(shard.sizes()) : "undefined",
                     "] is not the box's shape"));
  }
  if (absl::Status s = CheckDevice(shard.device()); !s.ok()) return s;
  if (!at::isFloatingType(shard.scalar_type())) {
    return absl::InvalidArgumentError("dropout needs a floating-point shard");
  }
  // The kernels below record no gradient: a shard that wants one would lose it silently.
  if (shard.requires_grad() && at::GradMode::is_enabled()) {
    return absl::FailedPreconditionError(
        "partitioned dropout records no gradient, and the shard requires one: apply "
        "PartitionedDropoutMask with at::mul (differentiable), or call it inside an autograd "
        "function whose backward is this dropout of the gradient (lockstep.rng.partitioned_dropout "
        "in Python is one)");
  }
  if (shard.is_cuda()) {
    return internal::CudaPhiloxDropout(shard, key, *strides, box, KeepThreshold(p),
                                       1.0 / (1.0 - p));
  }
  const uint32_t threshold = KeepThreshold(p);
  at::Tensor out;
  absl::Status status = CallTorch("partitioned dropout", [&] {
    at::Tensor input = shard.contiguous();
    out = at::empty_like(input);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "dropout", [&] {
      const scalar_t* in = input.data_ptr<scalar_t>();
      scalar_t* o_data = out.data_ptr<scalar_t>();
      // Half and bfloat16 compute in float, like the CUDA kernel, so both round alike.
      using Compute = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
      const Compute scale = static_cast<Compute>(1.0 / (1.0 - p));
      ForEachElement(key, global_shape, *strides, box, [=](int64_t o, uint32_t word) {
        o_data[o] = (word >> 8) >= threshold
                        ? static_cast<scalar_t>(static_cast<Compute>(in[o]) * scale)
                        : static_cast<scalar_t>(0);
      });
    });
  });
  if (!status.ok()) return status;
  return out;
}

}  // namespace rng
}  // namespace lockstep
