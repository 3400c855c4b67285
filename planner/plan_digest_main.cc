// plan_digest_main (testonly): prints the digest of the determinism batch's plan (see
// planner_testutil.h), so that tests can compare plans made by freshly exec'd processes, whose
// heap layout and address randomisation differ from the test's own.
//
//   plan_digest_main SEED     -> one line: the hex SHA-256 plan digest

#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "base/sha256.h"
#include "planner/planner.h"
#include "planner/planner_testutil.h"

int main(int argc, char** argv) {
  uint64_t seed = 0;
  if (argc != 2 || !absl::SimpleAtoi(argv[1], &seed)) {
    std::fprintf(stderr, "usage: plan_digest_main SEED\n");
    return 2;
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
