#include "rng/stream_io.h"

#include <fstream>
#include <sstream>
#include <string>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/process_world.h"

namespace lockstep {
namespace rng {
namespace {

using ::testing::HasSubstr;

// One "training step": the caller draws a token mask, the model draws dropout inside its
// scope, and a named stream draws too.
at::Tensor Step(ModelStream& model, NamedStreamTracker& tracker) {
  at::Tensor caller_mask = at::randint(0, 2, {16}).to(at::kFloat);
  at::Tensor model_mask;
  {
    ModelStreamScope scope(model);
    model_mask = at::dropout(at::ones({32}), 0.1, true);
  }
  at::Tensor named;
  {
    auto fork = tracker.Fork("tp");
    named = at::rand({8});
  }
  return at::cat({caller_mask, model_mask, named});
}

// First in the file: it forks, and the parent has done no LibTorch work yet.
TEST(StreamIoTest, ResumeInAFreshProcessDrawsWhatTheUninterruptedRunDraws) {
  const std::string dir = ::testing::TempDir();
  const std::string checkpoint = absl::StrCat(dir, "/rng_streams.pb");
  const std::string expected = absl::StrCat(dir, "/expected.pt");
  // Run 1: three steps, checkpoint after the first, record steps 2 and 3.
  std::vector<absl::Status> first =
      testing::RunProcessWorld({1}, [&](int, collectives::Communicator&) -> absl::Status {
        at::manual_seed(2024);
        ModelStream model({});
        NamedStreamTracker tracker({});
        if (auto s = tracker.Add("tp", 99); !s.ok()) return s;
        (void)Step(model, tracker);
        auto saved = CaptureStreams({}, model, &tracker);
        if (!saved.ok()) return saved.status();
        std::ofstream(checkpoint, std::ios::binary) << saved->SerializeAsString();
        at::Tensor later = at::cat({Step(model, tracker), Step(model, tracker)});
        std::ofstream out(expected, std::ios::binary);
        out.write(static_cast<const char*>(later.data_ptr()), later.nbytes());
        return absl::OkStatus();
      });
  ASSERT_TRUE(first[0].ok()) << first[0];
  // Run 2: a new process with a different seed and fresh streams restores and continues.
  std::vector<absl::Status> second =
      testing::RunProcessWorld({1}, [&](int, collectives::Communicator&) -> absl::Status {
        at::manual_seed(1);
        (void)at::rand({1000});
        ModelStream model({});
        NamedStreamTracker tracker({});
        std::stringstream bytes;
        bytes << std::ifstream(checkpoint, std::ios::binary).rdbuf();
        RngStreamsProto saved;
        if (!saved.ParseFromString(bytes.str())) return absl::DataLossError("checkpoint");
        if (auto s = RestoreStreams(saved, model, &tracker); !s.ok()) return s;
        at::Tensor resumed = at::cat({Step(model, tracker), Step(model, tracker)});
        std::stringstream want;
        want << std::ifstream(expected, std::ios::binary).rdbuf();
        const std::string got(static_cast<const char*>(resumed.data_ptr()), resumed.nbytes());
        if (got != want.str()) return absl::InternalError("resumed draws differ");
        return absl::OkStatus();
      });
  EXPECT_TRUE(second[0].ok()) << second[0];
}

TEST(StreamIoTest, RoundTripRewindsEveryStream) {
  at::manual_seed(10);
  ModelStream model({});
  NamedStreamTracker tracker({});
  ASSERT_TRUE(tracker.Add("tp", 77).ok());
  (void)Step(model, tracker);
  absl::StatusOr<RngStreamsProto> saved = CaptureStreams({}, model, &tracker);
  ASSERT_TRUE(saved.ok()) << saved.status();
  at::Tensor next = at::cat({Step(model, tracker), Step(model, tracker)});
  // Parse from bytes, as a checkpoint reader would.
  RngStreamsProto parsed;
  ASSERT_TRUE(parsed.ParseFromString(saved->SerializeAsString()));
  ASSERT_TRUE(RestoreStreams(parsed, model, &tracker).ok());
  EXPECT_TRUE(at::equal(at::cat({Step(model, tracker), Step(model, tracker)}), next));
}

TEST(StreamIoTest, BadCheckpointsChangeNothing) {
  at::manual_seed(3);
  ModelStream model({});
  NamedStreamTracker tracker({});
  ASSERT_TRUE(tracker.Add("tp", 5).ok());
  RngStreamsProto saved = *CaptureStreams({}, model, &tracker);
  const RngSnapshot live = *RngSnapshot::Capture({});

  RngStreamsProto wrong_version = saved;
  wrong_version.set_version(9);
  EXPECT_THAT(RestoreStreams(wrong_version, model, &tracker).message(), HasSubstr("version 9"));

  RngStreamsProto truncated = saved;
  truncated.mutable_named(0)->mutable_state()->set_cpu_state("short");
  absl::Status s = RestoreStreams(truncated, model, &tracker);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("named stream 'tp'"));

  RngStreamsProto other_device = saved;
  other_device.set_cuda_device(1);
  EXPECT_THAT(RestoreStreams(other_device, model, &tracker).message(),
              HasSubstr("saved for CUDA device 1"));

  EXPECT_EQ(*RngSnapshot::Capture({}), live);
  EXPECT_TRUE(tracker.Has("tp"));
  EXPECT_FALSE(model.state().has_value());
}

TEST(StreamIoTest, DuplicateSeedsAreInvalidAndChangeNothing) {
  at::manual_seed(4);
  ModelStream model({});
  NamedStreamTracker tracker({});
  ASSERT_TRUE(tracker.Add("a", 1).ok());
  ASSERT_TRUE(tracker.Add("b", 2).ok());
  RngStreamsProto saved = *CaptureStreams({}, model, &tracker);
  (void)at::rand({3});
  const RngSnapshot live = *RngSnapshot::Capture({});
  saved.mutable_named(1)->set_seed(1);
  absl::Status s = RestoreStreams(saved, model, &tracker);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("share seed 1"));
  EXPECT_EQ(*RngSnapshot::Capture({}), live);  // the caller was not rewound
  EXPECT_EQ(tracker.Snapshot().at("b").seed, 2u);
}

TEST(StreamIoTest, CaptureDuringAForkOrWithAnotherTrackerIsRefused) {
  ModelStream model({});
  NamedStreamTracker tracker({});
  ASSERT_TRUE(tracker.Add("tp", 1).ok());
  {
    auto fork = tracker.Fork("tp");
    EXPECT_EQ(CaptureStreams({}, model, &tracker).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
  NamedStreamTracker gpu_tracker({.cuda_device = 0});
  EXPECT_EQ(CaptureStreams({}, model, &gpu_tracker).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StreamIoTest, CaptureInsideAModelScopeIsRefused) {
  ModelStream model({});
  ModelStreamScope scope(model);
  EXPECT_EQ(CaptureStreams({}, model, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace rng
}  // namespace lockstep
