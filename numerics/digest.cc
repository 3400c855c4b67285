#include "numerics/digest.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "numerics/internal/chunk_hash_device.h"
#include "numerics/safetensors.h"
#include "xxhash.h"

namespace lockstep {
namespace numerics {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the digest hashes little-endian bytes");

void AppendU64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }

}  // namespace

std::string DigestHex128(const Digest128& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (uint8_t b : digest) {
    hex.push_back(kHex[b >> 4]);
    hex.push_back(kHex[b & 15]);
  }
  return hex;
}

Digest128 Xxh3Digest(absl::string_view bytes) {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits(bytes.data(), bytes.size()));
  Digest128 digest;
  std::memcpy(digest.data(), canonical.digest, 16);
  return digest;
}

void HashChunks(absl::string_view bytes, uint8_t* out) {
  const int64_t chunks =
      static_cast<int64_t>((bytes.size() + kDigestChunkBytes - 1) / kDigestChunkBytes);
  // Grain: 64 chunks (1 MiB) per task.
  at::parallel_for(0, chunks, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const size_t offset = static_cast<size_t>(i) * kDigestChunkBytes;
      const size_t size = std::min(kDigestChunkBytes, bytes.size() - offset);
      Digest128 digest;
      if (size == kDigestChunkBytes) {
        digest = Xxh3Digest(bytes.substr(offset, size));
      } else {
        char padded[kDigestChunkBytes] = {};
        std::memcpy(padded, bytes.data() + offset, size);
        digest = Xxh3Digest(absl::string_view(padded, kDigestChunkBytes));
      }
      std::memcpy(out + 16 * i, digest.data(), 16);
    }
  });
}

namespace {

// A tensor's record digest (DIGEST.md step 3), its chunk hashes streamed in as they come (a large
// tensor's are megabytes, and arrive in pieces: Note [Hashes in pieces] in chunk_hash_cuda.cc).
class RecordStream {
 public:
  RecordStream(absl::string_view dtype_name, absl::Span<const int64_t> shape, uint64_t num_bytes)
      : state_(XXH3_createState(), &XXH3_freeState) {
    LOCKSTEP_CHECK(state_ != nullptr) << "XXH3_createState: out of memory";
    std::string header("lockstep-tensor-v1", 18);
    header.push_back('\0');
    header.push_back(static_cast<char>(dtype_name.size()));
    header.append(dtype_name.data(), dtype_name.size());
    AppendU64(header, shape.size());
    for (int64_t d : shape) AppendU64(header, static_cast<uint64_t>(d));
    AppendU64(header, num_bytes);
    XXH3_128bits_reset(state_.get());
    XXH3_128bits_update(state_.get(), header.data(), header.size());
  }
  void Update(absl::string_view chunk_hashes) {
    XXH3_128bits_update(state_.get(), chunk_hashes.data(), chunk_hashes.size());
  }
  Digest128 Finish() const {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state_.get()));
    Digest128 digest;
    std::memcpy(digest.data(), canonical.digest, 16);
    return digest;
  }

 private:
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state_;
};

}  // namespace

Digest128 TensorRecordDigest(absl::string_view dtype_name, absl::Span<const int64_t> shape,
                             uint64_t num_bytes, absl::string_view chunk_hashes) {
  RecordStream record(dtype_name, shape, num_bytes);
  record.Update(chunk_hashes);
  return record.Finish();
}

Digest128 TensorBytesDigest(absl::string_view dtype_name, absl::Span<const int64_t> shape,
                            absl::string_view bytes) {
  std::string chunk_hashes(16 * ((bytes.size() + kDigestChunkBytes - 1) / kDigestChunkBytes), '\0');
  HashChunks(bytes, reinterpret_cast<uint8_t*>(chunk_hashes.data()));
  return TensorRecordDigest(dtype_name, shape, bytes.size(), chunk_hashes);
}

absl::StatusOr<Digest128> DigestTensor(const at::Tensor& tensor) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Digest128> digests, DigestTensors({tensor}));
  return digests[0];
}

// Note [Batched digests]
// A model's state is tens of thousands of tensors, most of them small (a 30B-class mixture of
// experts has ~20,000 expert matrices of a few MiB). Digested one by one, each CUDA tensor pays a
// wait for its kernel and a copy of its hashes, and each small CPU tensor hashes on one thread
// (its chunks are fewer than a parallel task's grain), and a small tensor's kernel fills a few of
// the GPU's multiprocessors. DigestTensors instead hashes every CUDA tensor of a device in one
// kernel over all their chunks, launched in pieces whose hashes come back while the next piece is
// hashed and are streamed into the records meanwhile (internal::StreamChunkHashes, Note [Hashes
// in pieces]), and hashes the CPU tensors in parallel across tensors,
// splitting within a tensor only when it is large. The digests are DigestTensor's, bit for bit
// (digest_test and digest_cuda_test check it).
absl::StatusOr<std::vector<Digest128>> DigestTensors(absl::Span<const at::Tensor> tensors) {
  std::vector<std::string> dtypes(tensors.size());
  std::vector<at::Tensor> on_devices;
  std::vector<size_t> device_index;  // tensors[device_index[k]] is on_devices[k]
  std::vector<size_t> small_cpu, large_cpu;
  constexpr int64_t kLargeBytes = 64 << 20;  // split within a tensor from here on
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot digest tensor ", i, ": undefined"));
    }
    absl::StatusOr<std::string> dtype = SafetensorsDtypeName(t.scalar_type());
    if (!dtype.ok()) return Annotate(dtype.status(), absl::StrCat("digesting tensor ", i));
    dtypes[i] = *std::move(dtype);
    if (!t.is_cpu() && !t.is_cuda()) {
      return absl::FailedPreconditionError(
          absl::StrCat("digesting tensor ", i, " on ", t.device().str(),
                       ": only CPU and CUDA tensors can be digested"));
    }
    if (t.is_cuda()) {
      on_devices.push_back(t);
      device_index.push_back(i);
    } else if (t.numel() * static_cast<int64_t>(t.element_size()) >= kLargeBytes) {
      large_cpu.push_back(i);
    } else {
      small_cpu.push_back(i);
    }
  }
  std::vector<Digest128> digests(tensors.size());
  auto digest_cpu = [&](size_t i) {
    const at::Tensor contiguous = tensors[i].contiguous();
    digests[i] =
        TensorBytesDigest(dtypes[i], tensors[i].sizes(),
                          absl::string_view(static_cast<const char*>(contiguous.data_ptr()),
                                            contiguous.numel() * contiguous.element_size()));
  };
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("digesting CPU tensors", [&] {
    for (size_t i : large_cpu) digest_cpu(i);  // each split over the threads (HashChunks)
    at::parallel_for(0, static_cast<int64_t>(small_cpu.size()), 1, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) digest_cpu(small_cpu[k]);  // one thread each
    });
  }));
  if (on_devices.empty()) return digests;
  // Each piece's tensors' records in parallel across tensors (a large state's hashes are tens of
  // megabytes); a tensor spanning pieces continues its record in the next.
  std::vector<std::unique_ptr<RecordStream>> records(on_devices.size());
  LOCKSTEP_RETURN_IF_ERROR(
      internal::StreamChunkHashes(on_devices, [&](absl::Span<const internal::LandedHashes> landed) {
        return CallTorch("digesting CUDA tensors' records", [&] {
          at::parallel_for(0, static_cast<int64_t>(landed.size()), 64, [&](int64_t b, int64_t e) {
            for (int64_t l = b; l < e; ++l) {
              const size_t k = landed[l].tensor;
              const at::Tensor& t = on_devices[k];
              if (records[k] == nullptr) {
                records[k] = std::make_unique<RecordStream>(
                    dtypes[device_index[k]], t.sizes(),
                    static_cast<uint64_t>(t.numel()) * t.element_size());
              }
              records[k]->Update(landed[l].hashes);
              if (landed[l].last) {
                digests[device_index[k]] = records[k]->Finish();
                records[k].reset();
              }
            }
          });
        });
      }));
  return digests;
}

absl::StatusOr<Digest128> StateDigest(std::vector<std::pair<std::string, Digest128>> named) {
  std::sort(named.begin(), named.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string record("lockstep-state-v1", 17);
  record.push_back('\0');
  AppendU64(record, named.size());
  for (size_t i = 0; i < named.size(); ++i) {
    if (i > 0 && named[i].first == named[i - 1].first) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name '", named[i].first, "' appears twice in one state"));
    }
    AppendU64(record, named[i].first.size());
    record.append(named[i].first);
    record.append(reinterpret_cast<const char*>(named[i].second.data()), 16);
  }
  return Xxh3Digest(record);
}

}  // namespace numerics
}  // namespace lockstep
