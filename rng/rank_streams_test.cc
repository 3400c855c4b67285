// rng/rank_streams: one owner of the rank's generators, model stream and named streams; the one
// generator-consistency check; shared ownership keeps scopes and forks valid.

#include "rng/rank_streams.h"

#include <memory>

#include "ATen/ATen.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace rng {
namespace {

using ::testing::HasSubstr;

TEST(RankStreamsTest, OwnsTheModelStreamAndNamedStreamsOfItsGenerators) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<RankStreams> streams,
                                RankStreams::Create(DefaultGenerators::CpuOnly()));
  EXPECT_EQ(streams->generators(), DefaultGenerators::CpuOnly());
  EXPECT_FALSE(streams->model().state().has_value());
  EXPECT_TRUE(streams->named().Names().empty());
  EXPECT_TRUE(streams->caller_state_live());
  LOCKSTEP_ASSERT_OK(streams->named().Add("tp", 12));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*streams));
  EXPECT_FALSE(streams->caller_state_live());
  LOCKSTEP_EXPECT_OK(scope.Exit());
  EXPECT_TRUE(streams->caller_state_live());
  EXPECT_TRUE(streams->model().state().has_value());
}

TEST(RankStreamsTest, AScopeKeepsItsStreamsAliveAfterTheCallerDropsThem) {
  at::manual_seed(21);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot caller, RngSnapshot::Capture({}));
  std::weak_ptr<RankStreams> weak;
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<RankStreams> streams,
                                  RankStreams::Create(DefaultGenerators::CpuOnly()));
    weak = streams;
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*streams));
    streams.reset();  // the scope holds its own share
    EXPECT_FALSE(weak.expired());
    (void)at::rand({5});
  }
  EXPECT_TRUE(weak.expired());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot after, RngSnapshot::Capture({}));
  EXPECT_EQ(after, caller);
}

TEST(RankStreamsTest, CheckGeneratorsAcceptsItsOwnGenerators) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<RankStreams> streams,
                                RankStreams::Create(DefaultGenerators::CpuOnly()));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RngSnapshot cpu, RngSnapshot::Seeded({}, 1, 1));
  LOCKSTEP_EXPECT_OK(streams->CheckGenerators(cpu, "a CPU snapshot"));
}

TEST(RankStreamsTest, CudaGeneratorsNeedACudaBuild) {
  if (LOCKSTEP_BUILT_WITH_CUDA) GTEST_SKIP() << "CUDA build: rng_cuda_test covers CUDA streams";
  absl::StatusOr<std::shared_ptr<RankStreams>> streams =
      RankStreams::Create(DefaultGenerators::WithCudaDevice(0));
  EXPECT_EQ(streams.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(streams.status().message(), HasSubstr("--config=cuda"));
}

}  // namespace
}  // namespace rng
}  // namespace lockstep
