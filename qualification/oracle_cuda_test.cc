// gpu: the trainer's oracle with CUDA tensors — model, inputs, masks, outputs and gradients on
// the GPU, the CUDA generators part of every rank's streams — on Gloo worlds whose processes
// share CUDA device 0 (DP1 x CP2, TP2 x CP2), the synchronization negative control, and over NCCL
// across GPUs (one process per GPU, CP = the GPU count; skipped with fewer than two GPUs).

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "qualification/oracle.h"
#include "testing/nccl_world.h"
#include "testing/process_world.h"

namespace lockstep {
namespace qualification {
namespace {

std::vector<absl::Status> RunCudaOracle(int dp, int tp, int cp, NegativeControl control) {
  collectives::ProcessWorldOptions options;
  options.world_size = dp * tp * cp;
  return collectives::RunProcessWorld(options, [=](int, collectives::Communicator& world) {
    return RunTrainerOracleVerdict(world, dp, tp, cp, control, c10::Device(c10::kCUDA, 0), true);
  });
}

TEST(TrainerOracleCudaTest, Dp1Cp2) {
  for (const absl::Status& s : RunCudaOracle(1, 1, 2, NegativeControl::kNone))
    EXPECT_TRUE(s.ok()) << s;
}

TEST(TrainerOracleCudaTest, Tp2Cp2) {
  for (const absl::Status& s : RunCudaOracle(1, 2, 2, NegativeControl::kNone))
    EXPECT_TRUE(s.ok()) << s;
}

TEST(TrainerOracleCudaTest, NegativeControlSynchronizationDisabled) {
  int detected = 0;
  for (const absl::Status& s : RunCudaOracle(1, 2, 2, NegativeControl::kNoSync)) {
    if (absl::StrContains(s.message(), "caller_draws:")) ++detected;
  }
  EXPECT_GT(detected, 0);
}

TEST(TrainerOracleCudaTest, NcclAcrossGpus) {
  collectives::NcclWorldResult result =
      collectives::RunNcclWorld({}, [](int rank, collectives::NcclCommunicator& world) {
        return RunTrainerOracleVerdict(world, 1, 1, world.size(), NegativeControl::kNone,
                                       c10::Device(c10::kCUDA, rank), true);
      });
  if (!result.skip_reason.empty()) GTEST_SKIP() << result.skip_reason;
  for (const absl::Status& s : result.ranks) EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace qualification
}  // namespace lockstep
