// numerics/internal/digest_arena.cc: a DigestArena's slices (digest_arena.h); enqueuing and
// collecting are the device's (digest_arena_cuda.cc, digest_arena_no_cuda.cc).

#include "numerics/internal/digest_arena.h"

#include <algorithm>

#include "ATen/ATen.h"

namespace lockstep {
namespace numerics {
namespace internal {

namespace {

// A new block's bytes: 65,536 chunk hashes, those of 1 GiB of tensors.
constexpr int64_t kBlockBytes = int64_t{1} << 20;

}  // namespace

DigestArena::Slice DigestArena::Take(const c10::Stream& stream, int64_t bytes) {
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Block& block = blocks_[i];
    if (block.stream != stream || block.device.numel() - block.used < bytes) continue;
    const Slice slice{static_cast<int>(i), block.used, bytes};
    block.used += bytes;
    return slice;
  }
  blocks_.push_back(Block{stream,
                          at::empty({std::max(kBlockBytes, bytes)},
                                    at::TensorOptions().dtype(at::kByte).device(stream.device())),
                          at::Tensor(), bytes});
  return Slice{static_cast<int>(blocks_.size() - 1), 0, bytes};
}

uint8_t* DigestArena::Address(const Slice& slice) {
  return blocks_[slice.block].device.data_ptr<uint8_t>() + slice.offset;
}

absl::string_view DigestArena::Read(const Slice& slice) const {
  if (slice.block < 0 || slice.bytes == 0) return absl::string_view();
  return absl::string_view(
      static_cast<const char*>(blocks_[slice.block].host.data_ptr()) + slice.offset,
      static_cast<size_t>(slice.bytes));
}

DigestArena::~DigestArena() {
  for (const c10::Stream& stream : streams_) {
    try {
      stream.synchronize();
    } catch (...) {  // a destructor does not throw; the device's error shows at its next call
    }
  }
}

void DigestArena::Reset() {
  for (Block& block : blocks_) block.used = 0;
  streams_.clear();
}

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
