#include "rng/resume_state.h"

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rng/cpu_generator_state.h"
#include "rng/internal/resume_envelope.h"
#include "testing/process_world.h"

namespace lockstep {
namespace rng {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<std::shared_ptr<RankStreams>> Streams() {
  return RankStreams::Create(DefaultGenerators::CpuOnly());
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
        absl::StatusOr<std::shared_ptr<RankStreams>> created = Streams();
        if (!created.ok()) return created.status();
        std::shared_ptr<RankStreams> streams = *std::move(created);
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
        absl::StatusOr<std::shared_ptr<RankStreams>> created = Streams();
        if (!created.ok()) return created.status();
        std::shared_ptr<RankStreams> streams = *std::move(created);
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
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams, Streams());
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
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams, Streams());
  ASSERT_TRUE(streams->named().Add("tp", 5).ok());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RngResumeStateProto saved, CaptureResumeState(*streams));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot live, RngSnapshot::Capture({}));

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
              HasSubstr("the RNG resume state holds state for CUDA device 1"));

  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot after_refusals, RngSnapshot::Capture({}));

  EXPECT_EQ(after_refusals, live);
  EXPECT_TRUE(streams->named().Has("tp"));
  EXPECT_FALSE(streams->model().state().has_value());
}

TEST(ResumeStateTest, DuplicateSeedsAreInvalidAndChangeNothing) {
  at::manual_seed(4);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams, Streams());
  ASSERT_TRUE(streams->named().Add("a", 1).ok());
  ASSERT_TRUE(streams->named().Add("b", 2).ok());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RngResumeStateProto saved, CaptureResumeState(*streams));
  (void)at::rand({3});
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot live, RngSnapshot::Capture({}));
  saved.mutable_named(1)->set_seed(1);
  absl::Status s = RestoreResumeState(saved, *streams);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("share seed 1"));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot after_refusal, RngSnapshot::Capture({}));
  EXPECT_EQ(after_refusal, live);  // the caller was not rewound
  EXPECT_EQ(streams->named().Snapshot().at("b").seed, 2u);
}

TEST(ResumeStateTest, CaptureAndRestoreDuringAForkAreRefused) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams, Streams());
  ASSERT_TRUE(streams->named().Add("tp", 1).ok());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RngResumeStateProto saved, CaptureResumeState(*streams));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(NamedStreamFork fork, streams->named().Fork("tp"));
  EXPECT_EQ(CaptureResumeState(*streams).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RestoreResumeState(saved, *streams).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ResumeStateTest, CaptureInsideAModelScopeIsRefused) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams, Streams());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*streams));
  EXPECT_EQ(CaptureResumeState(*streams).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A rank with a model stream and two named streams, after a step: every kind of stream saved.
struct SavedRank {
  std::shared_ptr<RankStreams> streams;
  RngResumeStateProto saved;
  std::string bytes;
};
absl::StatusOr<SavedRank> SaveRank() {
  at::manual_seed(11);
  absl::StatusOr<std::shared_ptr<RankStreams>> streams = Streams();
  if (!streams.ok()) return streams.status();
  SavedRank rank{*std::move(streams), {}, {}};
  if (absl::Status s = rank.streams->named().Add("tp", 7); !s.ok()) return s;
  if (absl::Status s = rank.streams->named().Add("expert-0", 8); !s.ok()) return s;
  if (absl::StatusOr<at::Tensor> step = Step(*rank.streams); !step.ok()) return step.status();
  absl::StatusOr<RngResumeStateProto> saved = CaptureResumeState(*rank.streams);
  if (!saved.ok()) return saved.status();
  rank.saved = *std::move(saved);
  absl::StatusOr<std::string> bytes = SerializeResumeState(rank.saved);
  if (!bytes.ok()) return bytes.status();
  rank.bytes = *std::move(bytes);
  return rank;
}

// Seals `envelope` with the right checksum (payload and stream list chosen freely), so that the
// checks behind the checksum are reached.
std::string Forge(RngResumeStateEnvelope envelope) {
  envelope.set_sha256(internal::ResumeEnvelopeDigest(envelope));
  return envelope.SerializeAsString();
}

RngResumeStateEnvelope Open(const std::string& bytes) {
  RngResumeStateEnvelope envelope;
  EXPECT_TRUE(envelope.ParseFromString(bytes));
  return envelope;
}

TEST(SealedResumeStateTest, RoundTripRestoresEveryStream) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(SavedRank rank, SaveRank());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor expected, TwoSteps(*rank.streams));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RngResumeStateProto parsed, ParseResumeState(rank.bytes));
  EXPECT_EQ(parsed.SerializeAsString(), rank.saved.SerializeAsString());
  const RngResumeStateEnvelope envelope = Open(rank.bytes);
  EXPECT_THAT(std::vector<std::string>(envelope.streams().begin(), envelope.streams().end()),
              ::testing::ElementsAre("caller", "model", "named/expert-0", "named/tp"));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto restored, Streams());
  LOCKSTEP_ASSERT_OK(RestoreResumeState(parsed, *restored));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor replayed, TwoSteps(*restored));
  EXPECT_TRUE(at::equal(replayed, expected));
  // The control for Forge: resealing the genuine contents gives the genuine bytes.
  EXPECT_EQ(Forge(envelope), rank.bytes);
}

TEST(SealedResumeStateTest, EverySingleByteFlipIsRefused) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const SavedRank rank, SaveRank());
  const std::string& bytes = rank.bytes;
  ASSERT_GT(bytes.size(), 3 * kTorchCpuStateBytes);
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (const uint8_t mask : {0x01, 0x80, 0xff}) {
      std::string flipped = bytes;
      flipped[i] = static_cast<char>(flipped[i] ^ mask);
      const absl::Status s = ParseResumeState(flipped).status();
      ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << "byte " << i << " ^ " << int{mask};
    }
  }
}

TEST(SealedResumeStateTest, EveryCutAndEveryAppendIsRefused) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(SavedRank rank, SaveRank());
  for (size_t size = 0; size < rank.bytes.size(); ++size) {
    ASSERT_EQ(ParseResumeState(rank.bytes.substr(0, size)).status().code(),
              absl::StatusCode::kDataLoss)
        << "cut to " << size << " of " << rank.bytes.size() << " bytes";
  }
  // Two states concatenated (protobuf would merge them), and a stray trailing byte.
  (void)at::rand({4});
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngResumeStateProto later_state,
                                CaptureResumeState(*rank.streams));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const std::string later, SerializeResumeState(later_state));
  const absl::Status twice = ParseResumeState(rank.bytes + later).status();
  EXPECT_EQ(twice.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(twice.message(), HasSubstr("not in canonical encoding"));
  EXPECT_EQ(ParseResumeState(rank.bytes + std::string(1, '\0')).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_THAT(ParseResumeState(std::string(kMaxResumeStateBytes + 1, 'x')).status().message(),
              HasSubstr("exceed the limit of 16777216"));
}

TEST(SealedResumeStateTest, SwappedStatesBreakTheSeal) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(SavedRank rank, SaveRank());
  RngResumeStateEnvelope envelope = Open(rank.bytes);
  RngResumeStateProto swapped = rank.saved;
  swapped.mutable_caller()->Swap(swapped.mutable_model());
  envelope.set_payload(swapped.SerializeAsString());
  const absl::Status s = ParseResumeState(envelope.SerializeAsString()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("checksum does not match"));
}

TEST(SealedResumeStateTest, ForgedEnvelopesAreCheckedBehindTheSeal) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(SavedRank rank, SaveRank());
  const RngResumeStateEnvelope genuine = Open(rank.bytes);

  // A stream dropped from the payload (a cut at a field boundary), list left as it was.
  RngResumeStateProto no_model = rank.saved;
  no_model.clear_model();
  RngResumeStateEnvelope dropped = genuine;
  dropped.set_payload(no_model.SerializeAsString());
  absl::Status s = ParseResumeState(Forge(dropped)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("lists 4 streams, the payload holds 3"));

  // Another format.
  RngResumeStateEnvelope future = genuine;
  future.set_format(2);
  s = ParseResumeState(Forge(future)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("format 2 is not the supported format 1"));

  // A payload that is not canonical (an explicit default field appended).
  RngResumeStateEnvelope padded = genuine;
  padded.set_payload(genuine.payload() + std::string("\x10\x00", 2));
  s = ParseResumeState(Forge(padded)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("payload is not a canonical resume state"));

  // An empty name and 10,000 named streams, listed consistently.
  auto reseal = [&](const RngResumeStateProto& payload) {
    RngResumeStateEnvelope envelope = genuine;
    envelope.clear_streams();
    envelope.add_streams("caller");
    if (payload.has_model()) envelope.add_streams("model");
    for (const NamedStreamProto& n : payload.named()) envelope.add_streams("named/" + n.name());
    envelope.set_payload(payload.SerializeAsString());
    return Forge(envelope);
  };
  RngResumeStateProto unnamed = rank.saved;
  unnamed.mutable_named(0)->clear_name();
  s = ParseResumeState(reseal(unnamed)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("non-empty name"));
  EXPECT_EQ(SerializeResumeState(unnamed).status().code(), absl::StatusCode::kInvalidArgument);

  RngResumeStateProto crowded = rank.saved;
  for (int i = 0; i < 10000 - 2; ++i) {
    NamedStreamProto* extra = crowded.add_named();
    extra->set_name(absl::StrCat("s", i));  // no state: 10,000 full ones exceed the byte limit
    extra->set_seed(100 + i);
  }
  s = ParseResumeState(reseal(crowded)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("holds 10000 named streams; the limit is 1024"));
  EXPECT_THAT(SerializeResumeState(crowded).status().message(), HasSubstr("limit is 1024"));
}

TEST(SealedResumeStateTest, AnImpossibleGeneratorStateIsInvalidArgumentAndChangesNothing) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(SavedRank rank, SaveRank());
  // Sealed correctly, but the model stream's engine position reads past its 624 words.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(CpuGeneratorState state,
                                ParseTorchCpuState(rank.saved.model().cpu_state()));
  state.left = 624;
  state.next = 624;
  // TorchCpuStateBytes writes what it is given; only parsing validates.
  RngResumeStateProto bad = rank.saved;
  bad.mutable_model()->set_cpu_state(TorchCpuStateBytes(state));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const std::string bad_bytes, SerializeResumeState(bad));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RngResumeStateProto parsed, ParseResumeState(bad_bytes));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto restored, Streams());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot live, RngSnapshot::Capture({}));
  const absl::Status s = RestoreResumeState(parsed, *restored);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model stream"));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot after_refusal, RngSnapshot::Capture({}));
  EXPECT_EQ(after_refusal, live);
  EXPECT_FALSE(restored->model().state().has_value());
}

}  // namespace
}  // namespace rng
}  // namespace lockstep
