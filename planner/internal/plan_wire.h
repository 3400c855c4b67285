// planner/internal/plan_wire.h  (private to planner/)
//
// Note [Plan bytes by hand]: a plan's digest is SHA-256 over its deterministic protobuf
// serialization (planner.h, PlanDigest), and replicas compute it for every step's plan. Protobuf
// writes those bytes in two generic passes (ByteSizeLong, then SerializeWithCachedSizes through a
// CodedOutputStream) whose per-value bookkeeping costs several times the hashing itself on a plan
// of a million sequences. The plan's layout is fixed (plan.proto: scalars, packed arrays and one
// repeated message), so this file writes the same bytes directly: one pass for the sizes (varint
// widths by bit arithmetic), one that encodes into a small buffer handed to a sink as it fills. The
// bytes are protobuf's, byte for byte, for every plan without unknown fields (a proto3 scalar or
// array at its default is omitted, a double counts as set unless its bits are all zero, negative
// int32 and enum values take ten bytes, fields in number order); a plan that carries unknown
// fields (parsed from a newer writer's bytes) is left to protobuf. plan_wire_test holds the two
// writers to the same bytes.
//
// Thread-safety: stateless.

#ifndef LOCKSTEP_PLANNER_INTERNAL_PLAN_WIRE_H_
#define LOCKSTEP_PLANNER_INTERNAL_PLAN_WIRE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/strings/string_view.h"
#include "planner/plan.pb.h"

namespace lockstep {
namespace planner {
namespace internal {

// Receives the encoding in order, a buffer at a time.
using WireSink = std::function<void(absl::string_view bytes)>;

// A microbatch's encoded size (without its tag and length) and the payload size of each of its
// packed arrays, in field order (batch_index, sequence_id, token_begin, cu_seqlens, loss_scale,
// shard_cp_rank, shard_num_tokens, shard_num_pieces).
struct MicrobatchWireSizes {
  uint64_t total = 0;
  uint64_t packed[8] = {};
};

// The plan's encoded sizes: the whole plan's and each microbatch's.
struct PlanWireSizes {
  uint64_t total = 0;
  uint64_t limits = 0;
  std::vector<MicrobatchWireSizes> microbatch;
};

// The sizes of `plan`'s deterministic serialization, or nullopt if the plan or one of its
// messages carries unknown fields (the caller then serializes with protobuf).
std::optional<PlanWireSizes> PlanWireSize(const Plan& plan);

// Writes `plan`'s deterministic serialization to `sink`: exactly sizes.total bytes, the same as
// protobuf's. Precondition: `sizes` is PlanWireSize(plan) of the unchanged plan.
void WritePlanWire(const Plan& plan, const PlanWireSizes& sizes, const WireSink& sink);

}  // namespace internal
}  // namespace planner
}  // namespace lockstep

#endif  // LOCKSTEP_PLANNER_INTERNAL_PLAN_WIRE_H_
