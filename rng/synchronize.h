// rng/synchronize.h
//
// Synchronize makes every member of a group hold the same default RNG state: the group's first
// member (group rank 0 — whatever its global rank) broadcasts its default CPU generator state
// and, when the rank has a CUDA device, its CUDA generator's seed and offset; the others
// install them. Use it on the TP x CP group of one DP worker after each point where the caller
// may have drawn, so that every replica's next random mask agrees.
//
// Scope: only the given group. A null group, or a group of one, is a no-op — "no group" never
// means "the whole world" — so different DP workers (different groups) are never coupled:
// identically seeded DP workers stay identical and differently seeded ones stay different.
//
// One broadcast of one byte tensor (the CPU state in lockstep's compact encoding, the CUDA seed
// and offset, then a status byte) carries it all; a member validates what it receives
// (cpu_generator_state.h) before installing it. It travels as a CPU tensor, which the Gloo
// communicator sends as is and the NCCL communicator stages through the device.
//
// It synchronizes the caller's state, so not inside a model-stream scope or a named-stream fork
// (the live generators then hold another stream): kFailedPrecondition. Not during CUDA graph
// capture either: the CUDA generator's position is graph-relative there, so the leader refuses
// (kFailedPrecondition). Whenever the leader cannot read its state it still broadcasts, marked
// as failed, and every member returns kFailedPrecondition naming it; a member that refuses still
// takes part in the broadcast before returning its error — no member is left waiting.
//
// Thread-safety: as the communicator's and the default generators'.
//
// Example:
//   LOCKSTEP_RETURN_IF_ERROR(rng::Synchronize(tp_cp_group.get(), *streams));

#ifndef LOCKSTEP_RNG_SYNCHRONIZE_H_
#define LOCKSTEP_RNG_SYNCHRONIZE_H_

#include "absl/status/status.h"
#include "collectives/communicator.h"
#include "rng/generators.h"
#include "rng/rank_streams.h"

namespace lockstep {
namespace rng {

// Precondition: every member's streams have the same kind of generators (all with or all
// without a CUDA device); a mismatch is reported by the communicator as mismatched arguments or
// by the receiver as a malformed state.
absl::Status Synchronize(collectives::Communicator* group, const RankStreams& streams);

// Bytes of the one broadcast Synchronize makes for `generators` (for benchmarks that compare it
// with a bare broadcast of the same size).
size_t SynchronizeWireBytes(const DefaultGenerators& generators);

}  // namespace rng
}  // namespace lockstep

#endif  // LOCKSTEP_RNG_SYNCHRONIZE_H_
