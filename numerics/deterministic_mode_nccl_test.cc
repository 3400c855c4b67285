// Note [NCCL reads its settings at creation]: deterministic mode and the NCCL communicators made
// before it. A test binary of its own: what it records stays for the rest of the process.

#include <cstdlib>

#include "base/nccl_settings.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "numerics/deterministic_mode.h"

namespace lockstep {
namespace numerics {
namespace {

using ::testing::HasSubstr;

// In order: a communicator created with the mode's own settings is no obstacle; one created
// before them, with NCCL choosing its algorithm, is refused by name.
TEST(DeterministicModeNcclTest, ACommunicatorCreatedWithTheModesSettingsIsNoObstacle) {
  setenv("NCCL_ALGO", "Ring", 1);
  setenv("NCCL_PROTO", "Simple", 1);
  RecordNcclCommunicatorSettings();
  LOCKSTEP_EXPECT_OK(EnforceDeterministicMode().status());
}

TEST(DeterministicModeNcclTest, ACommunicatorCreatedBeforeTheModeIsRefusedByName) {
  unsetenv("NCCL_ALGO");
  unsetenv("NCCL_PROTO");
  RecordNcclCommunicatorSettings();  // as NcclCommunicator::Create records it
  setenv("NCCL_ALGO", "Ring", 1);    // the mode's values, set after the communicator exists
  setenv("NCCL_PROTO", "Simple", 1);
  const absl::Status enforced = EnforceDeterministicMode().status();
  EXPECT_EQ(enforced.code(), absl::StatusCode::kFailedPrecondition) << enforced;
  EXPECT_THAT(enforced.message(),
              HasSubstr("an NCCL communicator of this process was created with NCCL_ALGO unset "
                        "and NCCL_PROTO unset"));
  EXPECT_THAT(enforced.message(), HasSubstr("enforce the mode before creating NCCL communicators"));
  EXPECT_EQ(VerifyDeterministicMode().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace numerics
}  // namespace lockstep
