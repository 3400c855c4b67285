#include "numerics/execution_context.h"

#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <set>

#include "ATen/Context.h"
#include "ATen/Parallel.h"
#include "base/json.h"
#include "invariant/mode.h"
#include "numerics/deterministic_mode.h"
#include "numerics/digest.h"
#include "numerics/internal/build_info.h"
#include "numerics/internal/device_context.h"
#include "torch/version.h"

namespace lockstep {
namespace numerics {
namespace {

using json = nlohmann::json;

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "unset" : value;
}

std::string MatmulPrecision() {
  switch (at::globalContext().float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGHEST:
      return "highest";
    case at::Float32MatmulPrecision::HIGH:
      return "high";
    case at::Float32MatmulPrecision::MEDIUM:
      return "medium";
  }
  return "unknown";
}

// Every leaf path of `value` under `prefix` into `out`.
void Leaves(const json& value, const std::string& prefix, std::map<std::string, json>& out) {
  if (value.is_object()) {
    for (const auto& [key, child] : value.items()) {
      Leaves(child, prefix.empty() ? key : prefix + "." + key, out);
    }
    return;
  }
  out[prefix] = value;
}

}  // namespace

json CaptureExecutionContext(const std::map<std::string, std::string>& caller) {
  at::Context& context = at::globalContext();
  json stable = {
      {"libtorch_version", TORCH_VERSION},
      {"compiler", __VERSION__},
      {"lockstep_commit", internal::BuildCommit()},
      {"cuda", internal::DeviceContext()},
      {"determinism",
       {{"deterministic_algorithms", context.deterministicAlgorithms()},
        {"deterministic_algorithms_warn_only", context.deterministicAlgorithmsWarnOnly()},
        {"cudnn_deterministic", context.deterministicCuDNN()},
        {"cudnn_benchmark", context.benchmarkCuDNN()},
        {"tf32_cublas", context.allowTF32CuBLAS()},
        {"tf32_cudnn", context.allowTF32CuDNN()},
        {"float32_matmul_precision", MatmulPrecision()},
        {"cublas_workspace_config", Env("CUBLAS_WORKSPACE_CONFIG")},
        {"nccl_algo", Env("NCCL_ALGO")},
        {"nccl_proto", Env("NCCL_PROTO")},
        // Whether lockstep's deterministic mode was enforced (numerics/deterministic_mode.h),
        // and whether it still holds now.
        {"mode_enforced", DeterministicModeEnforced()},
        {"mode_holds", VerifyDeterministicMode().ok()},
        // Placement-invariant mode (invariant/mode.h): which kernels the reference model ran.
        {"placement_invariant", invariant::ModeOn()}}},
      {"threads",
       {{"intra_op", at::get_num_threads()},
        {"inter_op", at::get_num_interop_threads()},
        {"omp_num_threads", Env("OMP_NUM_THREADS")}}},
      {"caller", caller},
  };
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  json record = {{"stable", stable},
                 {"volatile",
                  {{"host", host},
                   {"pid", static_cast<int64_t>(getpid())},
                   {"unix_time", static_cast<int64_t>(std::time(nullptr))}}}};
  record["digest"] = ContextDigest(record);
  return record;
}

std::string ContextDigest(const json& context) {
  const json stable = context.contains("stable") ? context["stable"] : json::object();
  return DigestHex128(Xxh3Digest(DumpJson(stable)));
}

std::map<std::string, std::string> ContextMetadata(const json& context) {
  return {{kContextMetadataKey, DumpJson(context)}};
}

std::optional<json> ContextFromMetadata(const std::map<std::string, std::string>& metadata) {
  const auto found = metadata.find(kContextMetadataKey);
  if (found == metadata.end()) return std::nullopt;
  absl::StatusOr<json> record = ParseJson(found->second, kContextMetadataKey);
  if (!record.ok() || !record->is_object() || !record->contains("stable")) return std::nullopt;
  return *std::move(record);
}

std::vector<std::string> ContextDifferences(const json& a, const json& b) {
  std::map<std::string, json> left, right;
  if (a.contains("stable")) Leaves(a["stable"], "", left);
  if (b.contains("stable")) Leaves(b["stable"], "", right);
  std::set<std::string> paths;
  for (const auto& [path, value] : left) {
    const auto other = right.find(path);
    if (other == right.end() || other->second != value) paths.insert(path);
  }
  for (const auto& [path, value] : right) {
    if (!left.count(path)) paths.insert(path);
  }
  return {paths.begin(), paths.end()};
}

}  // namespace numerics
}  // namespace lockstep
