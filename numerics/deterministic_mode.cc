#include "numerics/deterministic_mode.h"

#include <atomic>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ATen/Context.h"
#include "ATen/detail/CUDAHooksInterface.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/nccl_settings.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"

namespace lockstep {
namespace numerics {
namespace {

std::atomic<bool> enforced{false};

// Note [cuBLAS workspace setting]: a LibTorch that demands the variable has this check.
template <typename Context, typename = void>
struct HasCublasConfigCheck : std::false_type {};
template <typename Context>
struct HasCublasConfigCheck<
    Context,
    std::void_t<decltype(std::declval<const Context&>().alertCuBLASConfigNotDeterministic())>>
    : std::true_type {};

// An environment variable the mode checks, the values that satisfy it (the first is the one the
// mode sets when it is unset), and whether unset is a contradiction.
struct Variable {
  const char* name;
  std::vector<std::string> accepted;
  bool required;
};

const std::vector<Variable>& Variables() {
  static const auto* variables = new std::vector<Variable>{
      {"CUBLAS_WORKSPACE_CONFIG", {":4096:8", ":16:8"}, CublasWorkspaceConfigRequired()},
      {"NCCL_ALGO", {"Ring"}, true},
      {"NCCL_PROTO", {"Simple"}, true},
  };
  return *variables;
}

const char* Get(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

bool Accepts(const Variable& v, const std::string& value) {
  for (const std::string& a : v.accepted) {
    if (a == value) return true;
  }
  return false;
}

absl::Status Contradiction(absl::string_view setting, absl::string_view value,
                           absl::string_view required) {
  return absl::FailedPreconditionError(
      absl::StrCat("deterministic mode: ", setting, " is ", value, " but the mode requires ",
                   required, "; the mode overrides nothing the caller set: change or unset it"));
}

// Whether this process has started CUDA work (a primary context on any device).
absl::StatusOr<bool> CudaWorkStarted() {
  bool started = false;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("asking whether CUDA work has started", [&] {
    if (!at::hasCUDA()) return;
    const auto& hooks = at::detail::getCUDAHooks();
    for (int d = 0; d < hooks.getNumGPUs(); ++d) started = started || hooks.hasPrimaryContext(d);
  }));
  return started;
}

// The caller's settings that contradict the mode, first one first.
absl::Status CheckNoContradiction() {
  for (const Variable& v : Variables()) {
    const char* value = Get(v.name);
    if (value != nullptr && !Accepts(v, value)) {
      return Contradiction(v.name, absl::StrCat("'", value, "'"),
                           absl::StrCat("'", absl::StrJoin(v.accepted, "' or '"), "'"));
    }
  }
  const at::Context& context = at::globalContext();
  if (context.deterministicAlgorithms() && context.deterministicAlgorithmsWarnOnly()) {
    return Contradiction("deterministic algorithms' warn-only mode", "on",
                         "off (a nondeterministic operator must fail, not warn)");
  }
  if (context.benchmarkCuDNN()) {
    return Contradiction("cuDNN benchmark mode", "on", "off");
  }
  // Note [NCCL reads its settings at creation]: a communicator made before the mode keeps the
  // algorithm and protocol it read.
  for (const NcclSettings& made : NcclCommunicatorSettings()) {
    if (made.algo != "Ring" || made.proto != "Simple") {
      return absl::FailedPreconditionError(absl::StrCat(
          "deterministic mode: an NCCL communicator of this process was created with NCCL_ALGO ",
          made.algo.empty() ? "unset" : absl::StrCat("'", made.algo, "'"), " and NCCL_PROTO ",
          made.proto.empty() ? "unset" : absl::StrCat("'", made.proto, "'"),
          ", and keeps what it read, so its reductions may run in another order: enforce the "
          "mode before creating NCCL communicators"));
    }
  }
  if (CublasWorkspaceConfigRequired() && Get("CUBLAS_WORKSPACE_CONFIG") == nullptr) {
    LOCKSTEP_ASSIGN_OR_RETURN(const bool started, CudaWorkStarted());
    if (started) {
      return absl::FailedPreconditionError(
          "deterministic mode: CUBLAS_WORKSPACE_CONFIG is unset and CUDA work has already "
          "started, so setting it now may not reach cuBLAS: set CUBLAS_WORKSPACE_CONFIG=:4096:8 "
          "in the environment, or enforce the mode before any CUDA work");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DeterministicSettings> EnforceDeterministicMode() {
  LOCKSTEP_RETURN_IF_ERROR(CheckNoContradiction());
  for (const Variable& v : Variables()) {
    if (v.required && Get(v.name) == nullptr &&
        setenv(v.name, v.accepted.front().c_str(), 1) != 0) {
      return absl::InternalError(absl::StrCat("deterministic mode: cannot set ", v.name));
    }
  }
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("enforcing deterministic mode", [] {
    at::Context& context = at::globalContext();
    context.setDeterministicAlgorithms(true, /*warn_only=*/false);
    context.setDeterministicCuDNN(true);
    context.setBenchmarkCuDNN(false);
  }));
  LOCKSTEP_RETURN_IF_ERROR(VerifyDeterministicMode());
  enforced = true;
  DeterministicSettings found;
  const char* cublas = Get("CUBLAS_WORKSPACE_CONFIG");
  found.cublas_workspace_config = cublas == nullptr ? "" : cublas;
  found.cublas_workspace_config_required = CublasWorkspaceConfigRequired();
  return found;
}

absl::Status VerifyDeterministicMode() {
  LOCKSTEP_RETURN_IF_ERROR(CheckNoContradiction());
  for (const Variable& v : Variables()) {
    if (v.required && Get(v.name) == nullptr) {
      return Contradiction(v.name, "unset",
                           absl::StrCat("'", absl::StrJoin(v.accepted, "' or '"), "'"));
    }
  }
  const at::Context& context = at::globalContext();
  if (!context.deterministicAlgorithms()) {
    return Contradiction("deterministic algorithms", "off", "on");
  }
  if (!context.deterministicCuDNN()) return Contradiction("cuDNN deterministic", "off", "on");
  return absl::OkStatus();
}

bool CublasWorkspaceConfigRequired() { return HasCublasConfigCheck<at::Context>::value; }

void PrepareCublasForDeterminism() {
  if (CublasWorkspaceConfigRequired()) {
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  }
}

bool DeterministicModeEnforced() { return enforced; }

}  // namespace numerics
}  // namespace lockstep
