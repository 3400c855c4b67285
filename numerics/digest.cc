#include "numerics/digest.h"

#include <algorithm>
#include <cstring>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "absl/strings/str_cat.h"
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

Digest128 TensorRecordDigest(absl::string_view dtype_name, absl::Span<const int64_t> shape,
                             uint64_t num_bytes, absl::string_view chunk_hashes) {
  std::string record("lockstep-tensor-v1", 18);
  record.push_back('\0');
  record.push_back(static_cast<char>(dtype_name.size()));
  record.append(dtype_name.data(), dtype_name.size());
  AppendU64(record, shape.size());
  for (int64_t d : shape) AppendU64(record, static_cast<uint64_t>(d));
  AppendU64(record, num_bytes);
  record.append(chunk_hashes.data(), chunk_hashes.size());
  return Xxh3Digest(record);
}

Digest128 TensorBytesDigest(absl::string_view dtype_name, absl::Span<const int64_t> shape,
                            absl::string_view bytes) {
  std::string chunk_hashes(16 * ((bytes.size() + kDigestChunkBytes - 1) / kDigestChunkBytes), '\0');
  HashChunks(bytes, reinterpret_cast<uint8_t*>(chunk_hashes.data()));
  return TensorRecordDigest(dtype_name, shape, bytes.size(), chunk_hashes);
}

absl::StatusOr<Digest128> DigestTensor(const at::Tensor& tensor) {
  if (!tensor.defined()) return absl::InvalidArgumentError("cannot digest an undefined tensor");
  LOCKSTEP_ASSIGN_OR_RETURN(std::string dtype, SafetensorsDtypeName(tensor.scalar_type()));
  Digest128 digest;
  if (tensor.is_cpu()) {
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("digesting a CPU tensor", [&] {
      const at::Tensor contiguous = tensor.contiguous();
      digest = TensorBytesDigest(dtype, tensor.sizes(),
                                 absl::string_view(static_cast<const char*>(contiguous.data_ptr()),
                                                   contiguous.numel() * contiguous.element_size()));
    }));
    return digest;
  }
  LOCKSTEP_ASSIGN_OR_RETURN(std::string chunk_hashes, internal::HashChunksOnDevice(tensor));
  return TensorRecordDigest(dtype, tensor.sizes(),
                            static_cast<uint64_t>(tensor.numel()) * tensor.element_size(),
                            chunk_hashes);
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
