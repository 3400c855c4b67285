// plan_digest_main (testonly): prints the digest of the determinism batch's plan (see
// planner_testutil.h), so that tests can compare plans made by freshly exec'd processes, whose
// heap layout and address randomisation differ from the test's own.
//
//   plan_digest_main SEED     -> one line: the hex SHA-256 plan digest

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "base/sha256.h"
#include "base/tool_flags.h"
#include "planner/planner.h"
#include "planner/planner_testutil.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args =
      lockstep::ParseToolFlags(argc, argv, "plan_digest_main SEED: prints the plan's digest");
  uint64_t seed = 0;
  if (args.size() != 1 || !absl::SimpleAtoi(args[0], &seed)) {
    std::fprintf(
        stderr, "plan_digest_main: expected one argument SEED (an unsigned integer), got %s\n",
        args.empty() ? "none"
                     : ("'" + args[0] + "'" + (args.size() > 1 ? " and more" : "")).c_str());
    return lockstep::kBadInputExitCode;
  }
  absl::StatusOr<lockstep::planner::Plan> plan = lockstep::planner::PlanMicrobatches(
      lockstep::planner::DeterminismBatch(seed), lockstep::planner::DeterminismOptions());
  if (!plan.ok()) {
    std::fprintf(stderr, "plan_digest_main: %s\n", plan.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", lockstep::DigestHex(lockstep::planner::PlanDigest(*plan)).c_str());
  return 0;
}
