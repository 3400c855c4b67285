#include "rng/model_stream.h"

#include <memory>

#include <stdexcept>

#include "ATen/ATen.h"
#include "absl/status/statusor.h"
#include "base/sha256.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rng/rank_streams.h"

namespace lockstep {
namespace rng {
namespace {

absl::StatusOr<std::shared_ptr<RankStreams>> Streams() {
  return RankStreams::Create(DefaultGenerators::CpuOnly());
}

// The caller's draws after `body` must equal its draws had `body` never run.
template <typename Body>
void ExpectCallerUntouched(Body body) {
  at::manual_seed(42);
  (void)at::rand({5});
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot before, RngSnapshot::Capture({}));
  at::Tensor expected = at::rand({16});
  ASSERT_TRUE(before.Restore().ok());
  body();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot after, RngSnapshot::Capture({}));
  EXPECT_EQ(after, before);
  EXPECT_TRUE(at::equal(at::rand({16}), expected));
}

TEST(ModelStreamScopeTest, RestoresTheCallerAfterNormalReturn) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto stream, Streams());
  ExpectCallerUntouched([&] {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*stream));
    EXPECT_TRUE(scope.outermost());
    (void)at::rand({1000});
    (void)at::dropout(at::ones({100}), 0.3, true);
  });
}

TEST(ModelStreamScopeTest, RestoresTheCallerAfterAnException) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto stream, Streams());
  ExpectCallerUntouched([&] {
    try {
      LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*stream));
      (void)at::rand({10});
      throw std::runtime_error("model failed");
    } catch (const std::runtime_error&) {
    }
    EXPECT_FALSE(stream->model().in_scope());
  });
}

TEST(ModelStreamScopeTest, NestedScopesShareTheStreamAndRestoreOnce) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto flat, Streams());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto nested, Streams());
  at::manual_seed(7);
  at::Tensor flat_draws;
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*flat));
    flat_draws = at::rand({20});
  }
  at::manual_seed(7);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot caller, RngSnapshot::Capture({}));
  at::Tensor nested_draws;
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope outer, ModelStreamScope::Enter(*nested));
    at::Tensor a = at::rand({10});
    {
      LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope inner, ModelStreamScope::Enter(*nested));
      EXPECT_FALSE(inner.outermost());
      at::Tensor b = at::rand({10});
      nested_draws = at::cat({a, b});
    }
    EXPECT_TRUE(nested->model().in_scope());
  }
  EXPECT_FALSE(nested->model().in_scope());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot after_scopes, RngSnapshot::Capture({}));
  EXPECT_EQ(after_scopes, caller);
  // The inner scope continued the same stream rather than swapping anything.
  EXPECT_TRUE(at::equal(nested_draws, flat_draws));
}

TEST(ModelStreamScopeTest, TheStreamAdvancesAcrossScopes) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto stream, Streams());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto reference, Streams());
  at::manual_seed(11);
  at::Tensor first, second, continuous;
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*stream));
    first = at::rand({8});
  }
  (void)at::rand({3});  // the caller draws in between: irrelevant to the model stream
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*stream));
    second = at::rand({8});
  }
  EXPECT_FALSE(at::equal(first, second)) << "the second scope replayed the first one's draws";
  at::manual_seed(11);
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*reference));
    continuous = at::rand({16});
  }
  EXPECT_TRUE(at::equal(at::cat({first, second}), continuous));
}

TEST(ModelStreamScopeTest, DeterministicForAGivenCallerStateAndUncorrelatedWithIt) {
  at::manual_seed(2024);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot caller, RngSnapshot::Capture({}));
  at::Tensor caller_next = at::rand({32});
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto a, Streams());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto b, Streams());
  ASSERT_TRUE(caller.Restore().ok());
  at::Tensor from_a, from_b;
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*a));
    from_a = at::rand({32});
  }
  ASSERT_TRUE(caller.Restore().ok());
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*b));
    from_b = at::rand({32});
  }
  EXPECT_TRUE(at::equal(from_a, from_b));
  EXPECT_FALSE(at::equal(from_a, caller_next));
  // Another caller state derives another model stream.
  at::manual_seed(2025);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto c, Streams());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*c));
  EXPECT_FALSE(at::equal(at::rand({32}), from_a));
}

TEST(ModelStreamScopeTest, DerivationIsSha256OfSaltAndCallerState) {
  at::manual_seed(3);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot caller, RngSnapshot::Capture({}));
  absl::StatusOr<RngSnapshot> derived = ModelStream::Derive(caller);
  ASSERT_TRUE(derived.ok()) << derived.status();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto stream, Streams());
  { LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*stream)); }
  EXPECT_EQ(*stream->model().state(), *derived);
  // Computed independently: the CPU seed is the first 8 bytes (little endian) of
  // SHA-256(framed salt, framed CPU state, framed empty CUDA part).
  const Sha256Digest digest = Sha256Framed({kModelStreamSalt, caller.cpu_state(), ""});
  EXPECT_EQ(derived->cpu_seed(), DigestWord<0>(digest));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      const RngSnapshot seeded,
      RngSnapshot::Seeded({}, DigestWord<0>(digest), DigestWord<8>(digest)));
  EXPECT_EQ(*derived, seeded);
}

TEST(ModelStreamScopeTest, CallerReseedingOutsideIsRespected) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto stream, Streams());
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*stream));
    (void)at::rand({4});
  }
  at::manual_seed(555);
  at::Tensor expected = at::rand({8});
  at::manual_seed(555);
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*stream));
    (void)at::rand({100});
  }
  EXPECT_TRUE(at::equal(at::rand({8}), expected));
}

TEST(ModelStreamScopeTest, CallerReseedingInsideIsKeptAndTheModelStreamIsNotDisturbed) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto stream, Streams());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto reference, Streams());
  at::manual_seed(1);
  at::Tensor model_before;
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*stream));
    model_before = at::rand({4});
  }
  const RngSnapshot model_state = *stream->model().state();
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*stream));
    at::manual_seed(99);  // explicit reseed by caller code running inside the scope
    (void)at::rand({2});
  }
  // The caller owns seed 99: its generator continues from it.
  at::Tensor after = at::rand({6});
  at::manual_seed(99);
  (void)at::rand({2});
  EXPECT_TRUE(at::equal(at::rand({6}), after));
  // The model stream kept the state it had before that scope.
  EXPECT_EQ(*stream->model().state(), model_state);
}

TEST(ModelStreamScopeTest, ExitReportsAndIsIdempotentAndMovingKeepsOneScope) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto stream, Streams());
  at::manual_seed(8);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot caller, RngSnapshot::Capture({}));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*stream));
  ModelStreamScope moved = std::move(scope);  // the moved-from scope must not exit twice
  EXPECT_TRUE(moved.outermost());
  (void)at::rand({3});
  LOCKSTEP_EXPECT_OK(moved.Exit());
  EXPECT_FALSE(stream->model().in_scope());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot after_exit, RngSnapshot::Capture({}));
  EXPECT_EQ(after_exit, caller);
  LOCKSTEP_EXPECT_OK(moved.Exit());  // a second Exit does nothing
  LOCKSTEP_EXPECT_OK(scope.Exit());  // NOLINT(bugprone-use-after-move): moved-from is inert
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const RngSnapshot after_second_exit, RngSnapshot::Capture({}));
  EXPECT_EQ(after_second_exit, caller);
}

TEST(ModelStreamTest, RestoreRefusesInsideAScopeAndStatesOfOtherGenerators) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto stream, Streams());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RngSnapshot seeded, RngSnapshot::Seeded({}, 1, 1));
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ModelStreamScope scope, ModelStreamScope::Enter(*stream));
    EXPECT_EQ(stream->model().Restore(seeded).code(), absl::StatusCode::kFailedPrecondition);
  }
  LOCKSTEP_EXPECT_OK(stream->model().Restore(seeded));
  EXPECT_EQ(*stream->model().state(), seeded);
  LOCKSTEP_EXPECT_OK(stream->model().Restore(std::nullopt));
  EXPECT_FALSE(stream->model().state().has_value());
}

}  // namespace
}  // namespace rng
}  // namespace lockstep
