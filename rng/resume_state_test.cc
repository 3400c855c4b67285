#include "rng/resume_state.h"

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status_testutil.h"
#include "collectives/process_world.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace rng {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<RankStreams> Streams() {
  return *RankStreams::Create(DefaultGenerators::CpuOnly());
}

// One "training step": the caller draws a token mask, the model draws dropout inside its
// scope, and a named stream draws too.
absl::StatusOr<at::Tensor> Step(RankStreams& streams) {
  at::Tensor caller_mask = at::randint(0, 2, {16}).to(at::kFloat);
  at::Tensor model_mask;
  {
    absl::StatusOr<ModelStreamScope> scope = ModelStreamScope::Enter(streams);
    if (!scope.ok()) return scope.status();
    model_mask = at::dropout(at::ones({32}), 0.1, true);
  }
  at::Tensor named;
  {
    absl::StatusOr<NamedStreamFork> fork = streams.named().Fork("tp");
    if (!fork.ok()) return fork.status();
    named = at::rand({8});
  }
  return at::cat({caller_mask, model_mask, named});
}

absl::StatusOr<at::Tensor> TwoSteps(RankStreams& streams) {
  absl::StatusOr<at::Tensor> a = Step(streams);
  if (!a.ok()) return a.status();
  absl::StatusOr<at::Tensor> b = Step(streams);
  if (!b.ok()) return b.status();
  return at::cat({*a, *b});
}

// First in the file: it forks, and the parent has done no LibTorch work yet.
TEST(ResumeStateTest, ResumeInAFreshProcessDrawsWhatTheUninterruptedRunDraws) {
  const std::string dir = ::testing::TempDir();
  const std::string saved_path = absl::StrCat(dir, "/rng_resume_state.pb");
  const std::string expected = absl::StrCat(dir, "/expected.pt");
  collectives::ProcessWorldOptions one;
  one.world_size = 1;
  // Run 1: three steps, resume state after the first, record steps 2 and 3.
  std::vector<absl::Status> first =
      collectives::RunProcessWorld(one, [&](int, collectives::Communicator&) -> absl::Status {
        at::manual_seed(2024);
        std::shared_ptr<RankStreams> streams = Streams();
        if (auto s = streams->named().Add("tp", 99); !s.ok()) return s;
        if (auto s = Step(*streams); !s.ok()) return s.status();
        auto saved = CaptureResumeState(*streams);
        if (!saved.ok()) return saved.status();
        std::ofstream(saved_path, std::ios::binary) << saved->SerializeAsString();
        absl::StatusOr<at::Tensor> later = TwoSteps(*streams);
        if (!later.ok()) return later.status();
        std::ofstream out(expected, std::ios::binary);
        out.write(static_cast<const char*>(later->data_ptr()), later->nbytes());
        return absl::OkStatus();
      });
  ASSERT_TRUE(first[0].ok()) << first[0];
  // Run 2: a new process with a different seed and fresh streams restores and continues.
  std::vector<absl::Status> second =
      collectives::RunProcessWorld(one, [&](int, collectives::Communicator&) -> absl::Status {
        at::manual_seed(1);
        (void)at::rand({1000});
        std::shared_ptr<RankStreams> streams = Streams();
        std::stringstream bytes;
        bytes << std::ifstream(saved_path, std::ios::binary).rdbuf();
        RngResumeStateProto saved;
        if (!saved.ParseFromString(bytes.str())) return absl::DataLossError("resume state");
        if (auto s = RestoreResumeState(saved, *streams); !s.ok()) return s;
        absl::StatusOr<at::Tensor> resumed = TwoSteps(*streams);
        if (!resumed.ok()) return resumed.status();
        std::stringstream want;
        want << std::ifstream(expected, std::ios::binary).rdbuf();
        const std::string got(static_cast<const char*>(resumed->data_ptr()), resumed->nbytes());
        if (got != want.str()) return absl::InternalError("resumed draws differ");
        return absl::OkStatus();
      });
  EXPECT_TRUE(second[0].ok()) << second[0];
}

TEST(ResumeStateTest, RoundTripRewindsEveryStream) {
  at::manual_seed(10);
  auto streams = Streams();
  ASSERT_TRUE(streams->named().Add("tp", 77).ok());
  LOCKSTEP_ASSERT_OK(Step(*streams));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RngResumeStateProto saved, CaptureResumeState(*streams));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor next, TwoSteps(*streams));
  // Parse from bytes, as a checkpoint reader would.
  RngResumeStateProto parsed;
  ASSERT_TRUE(parsed.ParseFromString(saved.SerializeAsString()));
  LOCKSTEP_ASSERT_OK(RestoreResumeState(parsed, *streams));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor again, TwoSteps(*streams));
  EXPECT_TRUE(at::equal(again, next));
}

TEST(ResumeStateTest, BadResumeStatesChangeNothing) {
  at::manual_seed(3);
  auto streams = Streams();
  ASSERT_TRUE(streams->named().Add("tp", 5).ok());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RngResumeStateProto saved, CaptureResumeState(*streams));
  const RngSnapshot live = *RngSnapshot::Capture({});

  RngResumeStateProto wrong_version = saved;
  wrong_version.set_version(9);
  EXPECT_THAT(RestoreResumeState(wrong_version, *streams).message(), HasSubstr("version 9"));

  RngResumeStateProto truncated = saved;
  truncated.mutable_named(0)->mutable_state()->set_cpu_state("short");
  absl::Status s = RestoreResumeState(truncated, *streams);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("named stream 'tp'"));

  RngResumeStateProto other_device = saved;
  other_device.set_cuda_device(1);
  EXPECT_THAT(RestoreResumeState(other_device, *streams).message(),
              HasSubstr("saved for CUDA device 1"));

  EXPECT_EQ(*RngSnapshot::Capture({}), live);
  EXPECT_TRUE(streams->named().Has("tp"));
  EXPECT_FALSE(streams->model().state().has_value());
}

TEST(ResumeStateTest, DuplicateSeedsAreInvalidAndChangeNothing) {
  at::manual_seed(4);
  auto streams = Streams();
  ASSERT_TRUE(streams->named().Add("a", 1).ok());
  ASSERT_TRUE(streams->named().Add("b", 2).ok());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RngResumeStateProto saved, CaptureResumeState(*streams));
  (void)at::rand({3});
  const RngSnapshot live = *RngSnapshot::Capture({});
  saved.mutable_named(1)->set_seed(1);
  absl::Status s = RestoreResumeState(saved, *streams);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("share seed 1"));
  EXPECT_EQ(*RngSnapshot::Capture({}), live);  // the caller was not rewound
  EXPECT_EQ(streams->named().Snapshot().at("b").seed, 2u);
}

TEST(ResumeStateTest, CaptureAndRestoreDuringAForkAreRefused) {
  auto streams = Streams();
  ASSERT_TRUE(streams->named().Add("tp", 1).ok());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RngResumeStateProto saved, CaptureResumeState(*streams));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(NamedStreamFork fork, streams->named().Fork("tp"));
  EXPECT_EQ(CaptureResumeState(*streams).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RestoreResumeState(saved, *streams).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ResumeStateTest, CaptureInsideAModelScopeIsRefused) {
  auto streams = Streams();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*streams));
  EXPECT_EQ(CaptureResumeState(*streams).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace rng
}  // namespace lockstep
