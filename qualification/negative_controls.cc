#include "qualification/negative_controls.h"

#include <mutex>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "ATen/Context.h"
#include "ATen/core/Generator.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/torch_boundary.h"

namespace lockstep {
namespace qualification {
namespace {

class AliasedGenerators : public checkpoint::SavedRngState {
 public:
  explicit AliasedGenerators(std::vector<at::Generator> handles) : handles_(std::move(handles)) {}

  // The bug: the "saved" state is read from the live generator at restore time.
  absl::Status Restore() const override {
    return CallTorch("restoring aliased generators", [&] {
      for (const at::Generator& handle : handles_) {
        at::Generator live = handle;  // same GeneratorImpl
        std::lock_guard<std::mutex> lock(live.mutex());
        live.set_state(handle.get_state());
      }
    });
  }
  size_t ByteSize() const override { return sizeof(*this); }

 private:
  std::vector<at::Generator> handles_;
};

struct Named {
  NegativeControl control;
  const char* name;
};
constexpr Named kControls[] = {
    {NegativeControl::kNoSync, "no-sync"},
    {NegativeControl::kWorldSync, "world-sync"},
    {NegativeControl::kUnscopedModelWork, "unscoped-model-work"},
    {NegativeControl::kAliasingSnapshot, "aliasing-snapshot"},
    {NegativeControl::kShardLocalPhilox, "shard-local-philox"},
    {NegativeControl::kDoubleCountedRetry, "double-counted-retry"},
    {NegativeControl::kInputInsideScope, "input-inside-scope"},
    {NegativeControl::kNoSyncAfterMicrobatch, "no-sync-after-microbatch"},
    {NegativeControl::kNoSyncAfterDpForward, "no-sync-after-dp-forward"},
    {NegativeControl::kNoRestoreOnUnwind, "no-restore-on-unwind"},
    {NegativeControl::kStagingReplaces, "staging-replaces"},
    {NegativeControl::kResumeWithoutNamedStreams, "resume-without-named-streams"},
    {NegativeControl::kNondeterministicOp, "nondeterministic-op"},
    {NegativeControl::kResumeWithoutCallerStream, "resume-without-caller-stream"},
    {NegativeControl::kResumeWithoutModelStream, "resume-without-model-stream"},
    {NegativeControl::kResumeWithoutOptimizer, "resume-without-optimizer"},
    {NegativeControl::kRepeatabilityStreamNotRestored, "repeatability-stream-not-restored"},
    {NegativeControl::kMisroutedGather, "misrouted-gather"},
    {NegativeControl::kCpLocalAttention, "cp-local-attention"},
    {NegativeControl::kTpUnreducedGradient, "tp-unreduced-gradient"},
    {NegativeControl::kEmptyShardSkipsGather, "empty-shard-skips-gather"},
    {NegativeControl::kActorPartialLoad, "actor-partial-load"},
    {NegativeControl::kLibTorchAttention, "libtorch-attention"},
};

}  // namespace

std::string NegativeControlName(NegativeControl control) {
  for (const Named& named : kControls) {
    if (named.control == control) return named.name;
  }
  return "";
}

std::vector<std::string> NegativeControlNames() {
  std::vector<std::string> names;
  for (const Named& named : kControls) names.push_back(named.name);
  return names;
}

absl::StatusOr<NegativeControl> ParseNegativeControl(absl::string_view name) {
  if (name.empty() || name == "none") return NegativeControl::kNone;
  for (const Named& named : kControls) {
    if (name == named.name) return named.control;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown negative control '", name, "'; known: ",
                                                 absl::StrJoin(NegativeControlNames(), ", ")));
}

trainer::internal::ContractSeams TrainerSeamsFor(NegativeControl control) {
  trainer::internal::ContractSeams seams = trainer::internal::ContractSeams::Kept();
  switch (control) {
    case NegativeControl::kNoSync:
      seams.synchronize_at_create = false;
      seams.synchronize_at_registration = false;
      seams.synchronize_after_each_microbatch = false;
      seams.synchronize_after_all_microbatches = false;
      break;
    case NegativeControl::kNoSyncAfterMicrobatch:
      seams.synchronize_after_each_microbatch = false;
      break;
    case NegativeControl::kNoSyncAfterDpForward:
      seams.synchronize_after_all_microbatches = false;
      break;
    case NegativeControl::kUnscopedModelWork:
      seams.model_stream_scope = false;
      break;
    case NegativeControl::kMisroutedGather:
      seams.route_gathered_rows = false;
      break;
    case NegativeControl::kEmptyShardSkipsGather:
      seams.gather_with_an_empty_shard = false;
      break;
    default:
      break;
  }
  return seams;
}

absl::StatusOr<std::unique_ptr<checkpoint::SavedRngState>> AliasingRngSaver::Save() const {
  std::vector<at::Generator> handles;
  absl::Status status = CallTorch("aliasing the default generators", [&] {
    handles.push_back(at::detail::getDefaultCPUGenerator());
    if (generators_.has_cuda()) {
      handles.push_back(at::globalContext().defaultGenerator(
          at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(generators_.cuda_device))));
    }
  });
  if (!status.ok()) return status;
  return std::unique_ptr<checkpoint::SavedRngState>(new AliasedGenerators(std::move(handles)));
}

}  // namespace qualification
}  // namespace lockstep
