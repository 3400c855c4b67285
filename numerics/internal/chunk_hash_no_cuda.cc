// CPU-only builds: CUDA tensors cannot be produced.
#include "absl/strings/str_cat.h"
#include "numerics/internal/chunk_hash_device.h"

namespace lockstep {
namespace numerics {
namespace internal {

absl::Status StreamChunkHashes(absl::Span<const at::Tensor> tensors,
                               const std::function<absl::Status(absl::Span<const LandedHashes>)>&) {
  if (tensors.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("digesting a tensor on ", tensors[0].device().str(),
                   " needs a CUDA build of lockstep (--config=cuda)"));
}

absl::StatusOr<at::Tensor> EnqueueChunkHashes(const at::Tensor& tensor) {
  return absl::FailedPreconditionError(
      absl::StrCat("digesting a tensor on ", tensor.device().str(),
                   " needs a CUDA build of lockstep (--config=cuda)"));
}

absl::StatusOr<EnqueuedDigest> EnqueueTensorDigest(const at::Tensor& tensor, bool summarize) {
  (void)summarize;
  return absl::FailedPreconditionError(
      absl::StrCat("digesting a tensor on ", tensor.device().str(),
                   " needs a CUDA build of lockstep (--config=cuda)"));
}

absl::StatusOr<ChunkHashes> CollectChunkHashes(absl::Span<const at::Tensor> device_hashes) {
  if (device_hashes.empty()) return ChunkHashes();
  return absl::FailedPreconditionError(
      absl::StrCat("collecting chunk hashes from ", device_hashes[0].device().str(),
                   " needs a CUDA build of lockstep (--config=cuda)"));
}

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
