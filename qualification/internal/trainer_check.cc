#include <cstdlib>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "base/status_macros.h"
#include "qualification/internal/checks.h"
#include "qualification/oracle.h"

namespace lockstep {
namespace qualification {

absl::StatusOr<std::vector<CheckResult>> CheckTrainer(RankSetup& setup) {
  LOCKSTEP_ASSIGN_OR_RETURN(const c10::Device device, RankDevice(setup));
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::vector<OracleCheck> checks,
      RunTrainerOracle(setup.groups.world(), setup.groups.topology(), setup.control, device));
  std::vector<CheckResult> results;
  for (const OracleCheck& c : checks) {
    results.push_back(CheckResult::Make(c.name, c.passed, c.detail));
  }
  return results;
}

absl::StatusOr<c10::Device> RankDevice(const RankSetup& setup) {
  if (setup.device != "cuda") return c10::Device(c10::kCPU);
  if (!at::hasCUDA() || at::getNumGPUs() == 0) {
    return absl::FailedPreconditionError(
        "--device cuda: this build or machine has no CUDA device (build with --config=cuda)");
  }
  // The rank's GPU on its node: its local rank (as NcclCommunicator binds it), modulo the GPUs.
  const char* local = std::getenv("LOCAL_RANK");
  const int rank = local != nullptr ? std::atoi(local) : setup.groups.world().rank();
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(rank % at::getNumGPUs()));
}

}  // namespace qualification
}  // namespace lockstep
