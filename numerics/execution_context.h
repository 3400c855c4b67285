// numerics/execution_context.h
//
// What can make two matched runs differ outside their tensors, recorded beside the evidence:
// LibTorch, CUDA runtime and driver, NCCL and cuBLAS versions; device names and UUIDs; the
// compiler and lockstep's build commit; the determinism settings (deterministic algorithms and
// their warn-only mode, cuDNN deterministic/benchmark, TF32 for cuBLAS and cuDNN, float32 matmul
// precision, CUBLAS_WORKSPACE_CONFIG, NCCL_ALGO and NCCL_PROTO, and whether lockstep's
// deterministic mode was enforced and still holds: numerics/deterministic_mode.h; whether
// placement-invariant mode is on: invariant/mode.h); LibTorch's
// intra- and inter-op thread counts and OMP_NUM_THREADS; and the caller's own fields (seeds,
// topology).
//
// The record is JSON: {"stable": {...}, "volatile": {...}, "digest": hex}. "stable" holds what
// must match for two runs to be expected to match (everything above); "volatile" what may differ
// harmlessly (host name, process id, time). The digest is the XXH3-128 (numerics/digest.h) of
// the compact dump of "stable" (keys sorted, as nlohmann::json stores them). Evidence files
// (compare, inventory, qualify) carry the record; a safetensors file written with
// ContextMetadata carries it under the metadata key "lockstep.execution_context", and
// ContextDifferences names the stable fields that differ between two records.
//
// Thread-safety: CaptureExecutionContext reads process-wide settings; call it from one thread.
//
// Example:
//   nlohmann::json context = numerics::CaptureExecutionContext({{"seed", "1234"}});
//   LOCKSTEP_RETURN_IF_ERROR(
//       numerics::WriteSafetensors(path, grads, numerics::ContextMetadata(context)));

#ifndef LOCKSTEP_NUMERICS_EXECUTION_CONTEXT_H_
#define LOCKSTEP_NUMERICS_EXECUTION_CONTEXT_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace lockstep {
namespace numerics {

// The safetensors metadata key under which ContextMetadata puts the record (its JSON dump).
inline constexpr char kContextMetadataKey[] = "lockstep.execution_context";

// The record described above; `caller` fields go under stable.caller.
nlohmann::json CaptureExecutionContext(const std::map<std::string, std::string>& caller = {});

// The stable digest of a record's "stable" object (recomputed, not read from the record).
std::string ContextDigest(const nlohmann::json& context);

// Metadata for WriteSafetensors carrying `context`.
std::map<std::string, std::string> ContextMetadata(const nlohmann::json& context);

// The record a file's metadata carries, if any (and if it parses as one).
std::optional<nlohmann::json> ContextFromMetadata(
    const std::map<std::string, std::string>& metadata);

// The paths ("cuda.driver_version", "determinism.tf32_cublas", "caller.seed") of stable fields
// whose values differ between `a` and `b`, or that only one has, sorted.
std::vector<std::string> ContextDifferences(const nlohmann::json& a, const nlohmann::json& b);

}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_EXECUTION_CONTEXT_H_
