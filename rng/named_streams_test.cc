#include "rng/named_streams.h"

#include <stdexcept>

#include "ATen/ATen.h"
#include "absl/status/statusor.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rng/rank_streams.h"

namespace lockstep {
namespace rng {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<std::shared_ptr<RankStreams>> Streams() {
  return RankStreams::Create(DefaultGenerators::CpuOnly());
}

at::Tensor DrawsOfSeed(uint64_t seed, int64_t skip, int64_t n) {
  at::manual_seed(seed);
  if (skip > 0) (void)at::rand({skip});
  return at::rand({n});
}

TEST(NamedStreamTrackerTest, ForkDrawsFromTheNamedStreamAndRestoresTheOutside) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams, Streams());
  NamedStreamTracker& tracker = streams->named();
  ASSERT_TRUE(tracker.Add("tp", 1000).ok());
  ASSERT_TRUE(tracker.Add("expert", 2000).ok());
  at::manual_seed(5);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot outside, RngSnapshot::Capture({}));
  at::Tensor tp_first, tp_second, expert_first;
  {
    auto fork = tracker.Fork("tp");
    ASSERT_TRUE(fork.ok()) << fork.status();
    tp_first = at::rand({4});
  }
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot after_first_fork, RngSnapshot::Capture({}));
  EXPECT_EQ(after_first_fork, outside);
  {
    auto fork = tracker.Fork("expert");
    expert_first = at::rand({4});
  }
  {
    auto fork = tracker.Fork("tp");
    tp_second = at::rand({4});
  }
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot after_forks, RngSnapshot::Capture({}));
  EXPECT_EQ(after_forks, outside);
  EXPECT_TRUE(at::equal(tp_first, DrawsOfSeed(1000, 0, 4)));
  EXPECT_TRUE(at::equal(tp_second, DrawsOfSeed(1000, 4, 4)));  // the stream advanced
  EXPECT_TRUE(at::equal(expert_first, DrawsOfSeed(2000, 0, 4)));
  EXPECT_THAT(tracker.Names(), ElementsAre("expert", "tp"));
}

TEST(NamedStreamTrackerTest, ExceptionInsideAForkStillRestores) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams, Streams());
  NamedStreamTracker& tracker = streams->named();
  ASSERT_TRUE(tracker.Add("tp", 1).ok());
  at::manual_seed(6);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot outside, RngSnapshot::Capture({}));
  try {
    auto fork = tracker.Fork("tp");
    (void)at::rand({3});
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot after_exception, RngSnapshot::Capture({}));
  EXPECT_EQ(after_exception, outside);
  auto fork = tracker.Fork("tp");  // no fork left active
  EXPECT_TRUE(fork.ok());
}

TEST(NamedStreamTrackerTest, DuplicateNamesAndSeedsAreRefused) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams, Streams());
  NamedStreamTracker& tracker = streams->named();
  ASSERT_TRUE(tracker.Add("a", 7).ok());
  absl::Status name = tracker.Add("a", 8);
  EXPECT_EQ(name.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(name.message(), HasSubstr("'a' already exists"));
  absl::Status seed = tracker.Add("b", 7);
  EXPECT_EQ(seed.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(seed.message(), HasSubstr("seed 7 of named stream 'b' is already used by 'a'"));
  EXPECT_EQ(tracker.Add("", 9).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tracker.Fork("missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(NamedStreamTrackerTest, ForksDoNotNest) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams, Streams());
  NamedStreamTracker& tracker = streams->named();
  ASSERT_TRUE(tracker.Add("a", 1).ok());
  ASSERT_TRUE(tracker.Add("b", 2).ok());
  auto outer = tracker.Fork("a");
  ASSERT_TRUE(outer.ok());
  EXPECT_EQ(tracker.Fork("b").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tracker.Reset().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(NamedStreamTrackerTest, SnapshotAndRestoreAllAreValues) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams, Streams());
  NamedStreamTracker& tracker = streams->named();
  ASSERT_TRUE(tracker.Add("tp", 31).ok());
  const auto saved = tracker.Snapshot();
  at::Tensor first;
  {
    auto fork = tracker.Fork("tp");
    first = at::rand({5});
  }
  EXPECT_NE(tracker.Snapshot().at("tp").state, saved.at("tp").state);  // saved did not move
  ASSERT_TRUE(tracker.Restore(saved).ok());
  {
    auto fork = tracker.Fork("tp");
    EXPECT_TRUE(at::equal(at::rand({5}), first));  // rewound: same draws again
  }
  ASSERT_TRUE(tracker.Reset().ok());
  EXPECT_FALSE(tracker.Has("tp"));
  auto clash = saved;
  clash.emplace("other", NamedStreamTracker::Stream{31, saved.at("tp").state});
  EXPECT_EQ(tracker.Restore(clash).code(), absl::StatusCode::kAlreadyExists);
}

TEST(NamedStreamTrackerTest, ExitStoresTheStreamOnceAndTheForkIsNoLongerActive) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams, Streams());
  NamedStreamTracker& tracker = streams->named();
  ASSERT_TRUE(tracker.Add("tp", 77).ok());
  at::manual_seed(3);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot outside, RngSnapshot::Capture({}));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(NamedStreamFork fork, tracker.Fork("tp"));
  EXPECT_TRUE(tracker.forked());
  EXPECT_FALSE(streams->caller_state_live());
  const at::Tensor drawn = at::rand({4});
  LOCKSTEP_EXPECT_OK(fork.Exit());
  EXPECT_FALSE(tracker.forked());
  EXPECT_TRUE(streams->caller_state_live());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot after_exit, RngSnapshot::Capture({}));
  EXPECT_EQ(after_exit, outside);
  LOCKSTEP_EXPECT_OK(fork.Exit());  // idempotent: the stream is not stored twice
  EXPECT_TRUE(at::equal(drawn, DrawsOfSeed(77, 0, 4)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(NamedStreamFork again, tracker.Fork("tp"));
  const at::Tensor continued = at::rand({4});
  LOCKSTEP_ASSERT_OK(again.Exit());
  EXPECT_TRUE(at::equal(continued, DrawsOfSeed(77, 4, 4)));
}

TEST(NamedStreamTrackerTest, RestoreRefusesEmptyNames) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams, Streams());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RngSnapshot state, RngSnapshot::Seeded({}, 5, 5));
  std::map<std::string, NamedStreamTracker::Stream> bad;
  bad.emplace("", NamedStreamTracker::Stream{5, state});
  EXPECT_EQ(streams->named().Restore(bad).code(), absl::StatusCode::kInvalidArgument);
}

TEST(NamedStreamTrackerTest, TheStreamCountAndNameLengthAreLimited) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams, Streams());
  EXPECT_TRUE(streams->named().Add(std::string(kMaxStreamNameBytes, 'n'), 1).ok());
  const absl::Status long_name = streams->named().Add(std::string(kMaxStreamNameBytes + 1, 'n'), 2);
  EXPECT_EQ(long_name.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(long_name.message(), HasSubstr("name of 257 bytes exceeds the limit of 256 bytes"));
  for (int i = 1; i < kMaxNamedStreams; ++i) {
    ASSERT_TRUE(streams->named().Add(absl::StrCat("s", i), 100 + i).ok()) << i;
  }
  const absl::Status full = streams->named().Add("one-more", 1u << 20);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("already holds the limit of 1024 named streams"));

  std::map<std::string, NamedStreamTracker::Stream> crowded = streams->named().Snapshot();
  crowded.emplace("one-more", NamedStreamTracker::Stream{1u << 20, crowded.begin()->second.state});
  const absl::Status restore = streams->named().Restore(crowded);
  EXPECT_EQ(restore.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(restore.message(), HasSubstr("1025 named streams exceed the limit of 1024"));
}

}  // namespace
}  // namespace rng
}  // namespace lockstep
