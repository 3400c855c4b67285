// rng/internal/resume_envelope.h
//
// Private to rng/ (and its tests and fuzzers): the seal of a resume state envelope
// (rng/resume_state.h), exposed so that tests can forge envelopes whose checksum is right and
// reach the checks behind it.

#ifndef LOCKSTEP_RNG_INTERNAL_RESUME_ENVELOPE_H_
#define LOCKSTEP_RNG_INTERNAL_RESUME_ENVELOPE_H_

#include <string>

#include "rng/resume_state.pb.h"

namespace lockstep {
namespace rng {
namespace internal {

// SHA-256 (32 raw bytes) over the framed tag "lockstep/rng-resume-state", the format, the number
// of streams, each stream name framed, and the payload framed: everything in the envelope but
// the checksum itself.
std::string ResumeEnvelopeDigest(const RngResumeStateEnvelope& envelope);

}  // namespace internal
}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_INTERNAL_RESUME_ENVELOPE_H_
