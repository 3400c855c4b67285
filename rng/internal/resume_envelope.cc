#include "rng/internal/resume_envelope.h"

#include "base/sha256.h"

namespace lockstep {
namespace rng {
namespace internal {

std::string ResumeEnvelopeDigest(const RngResumeStateEnvelope& envelope) {
  Sha256Hasher hasher;
  hasher.AppendFramed("lockstep/rng-resume-state");
  hasher.AppendLength(envelope.format());
  hasher.AppendLength(static_cast<uint64_t>(envelope.streams_size()));
  for (const std::string& stream : envelope.streams()) hasher.AppendFramed(stream);
  hasher.AppendFramed(envelope.payload());
  const Sha256Digest digest = hasher.Finish();
  return std::string(digest.begin(), digest.end());
}

}  // namespace internal
}  // namespace rng
}  // namespace lockstep
