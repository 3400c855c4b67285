#include "rng/generators.h"

#include <atomic>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace rng {
namespace internal {
namespace {

const CudaGeneratorHooks* registered_hooks = nullptr;
std::atomic<bool> graph_safe_enabled{true};

}  // namespace

void RegisterCudaGeneratorHooks(const CudaGeneratorHooks& hooks) {
  static CudaGeneratorHooks stored = hooks;
  registered_hooks = &stored;
}

const CudaGeneratorHooks* CudaHooks() { return registered_hooks; }

absl::Status RequireCudaSupport(int device) {
  if (registered_hooks == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA generator of device ", device,
                     " requested, but this build has no CUDA support (build with --config=cuda)"));
  }
  return absl::OkStatus();
}

void SetGraphSafeCudaStateEnabledForTesting(bool enabled) { graph_safe_enabled = enabled; }

bool CudaGeneratorsLinked() { return registered_hooks != nullptr; }

bool GraphSafeCudaStateAvailable() {
  return registered_hooks != nullptr && registered_hooks->graph_safe_supported &&
         graph_safe_enabled;
}

}  // namespace internal
}  // namespace rng
}  // namespace lockstep
