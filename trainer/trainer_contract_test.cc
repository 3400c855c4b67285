// TrainerRank's contracts outside the happy path, on multi-process Gloo worlds (each rank a process
// with its own default generators): a forward that fails on one replica is every replica's error
// at once and the next call works; the model stream agrees whatever the caller draws after
// Create; the caller's state is repaired at every hand-back of both forward paths, however the
// replicas' draws diverged between hand-backs, and DP workers stay distinct; custom objects are
// compared structurally and registered all or nothing; forwards without gradients; a model that
// draws a rank-dependent amount from the model stream.

#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/core/grad_mode.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rng/model_stream.h"
#include "rng/rank_streams.h"
#include "rng/snapshot.h"
#include "testing/process_world.h"
#include "trainer/internal/contract_seams.h"
#include "trainer/trainer_rank.h"

namespace lockstep {
namespace trainer {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

absl::Status Expect(bool condition, const std::string& what) {
  return condition ? absl::OkStatus() : absl::InternalError(what);
}

// Nanoseconds of CLOCK_MONOTONIC: one clock for every process of the host.
int64_t MonotonicNanos() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}

// A rank of a DP x TP x CP world with a trainer over y = dropout(x * w) (model-stream dropout),
// or over the forward the test gives.
struct Rig {
  collectives::Topology topology;
  std::shared_ptr<collectives::Communicator> group;  // TP x CP
  std::shared_ptr<rng::RankStreams> streams;
  at::Tensor w;
  std::unique_ptr<TrainerRank> trainer;
};

struct RigOptions {
  int dp = 1, tp = 1, cp = 2;
  int64_t seed = 0;  // the caller's seed (before Create); rank-dependent by default
  bool seed_by_rank = true;
  bool admission = false;
  std::function<absl::StatusOr<at::Tensor>(Rig&, const ShardWork&)> forward;
  internal::ContractSeams seams = internal::ContractSeams::Kept();
};

absl::StatusOr<std::unique_ptr<Rig>> MakeRig(int rank, collectives::Communicator& world,
                                             const RigOptions& options) {
  LOCKSTEP_ASSIGN_OR_RETURN(
      collectives::Topology topology,
      collectives::Topology::CreateExact(world.size(), options.dp, options.tp, options.cp));
  auto rig = std::unique_ptr<Rig>(new Rig{std::move(topology), nullptr, nullptr, {}, nullptr});
  LOCKSTEP_ASSIGN_OR_RETURN(rig->group, world.NewGroup(rig->topology.TpCpGroup(rank)));
  LOCKSTEP_ASSIGN_OR_RETURN(rig->streams,
                            rng::RankStreams::Create(rng::DefaultGenerators::CpuOnly()));
  at::manual_seed(options.seed + (options.seed_by_rank ? 1000 * rank : 0));
  rig->w = at::linspace(0.5, 1.5, 3).set_requires_grad(true);
  TrainerConfig config = TrainerConfig::Of(16);
  config.plan.packing = planner::PACKING_IN_ORDER;
  if (options.admission) {
    LOCKSTEP_ASSIGN_OR_RETURN(config.memory_model, admission::MemoryModel::Of(0, 1));
    config.memory_cap_bytes = 1 << 20;
  }
  Rig* raw = rig.get();
  auto forward = options.forward;
  LOCKSTEP_ASSIGN_OR_RETURN(
      rig->trainer,
      internal::CreateWithSeams(
          config, TrainerRank::Collaborators::Of(raw->topology, rank, raw->group, raw->streams),
          [raw, forward](const ShardWork& work) -> absl::StatusOr<at::Tensor> {
            if (forward) return forward(*raw, work);
            return at::dropout(work.inputs * raw->w, 0.5, /*train=*/true);
          },
          options.seams));
  return rig;
}

std::vector<planner::Sequence> Batch() {
  return {planner::Sequence::Of(10, 1), planner::Sequence::Of(6, 2), planner::Sequence::Of(12, 3),
          planner::Sequence::Of(4, 4)};
}

at::Tensor Rows() { return at::cos(at::arange(32 * 3, at::kFloat).reshape({32, 3})); }

// The SHA-256 of this rank's caller CPU state, as a byte tensor.
absl::StatusOr<at::Tensor> CallerDigest(const rng::RankStreams& streams) {
  LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot live, rng::RngSnapshot::Capture(streams.generators()));
  const Sha256Digest digest = Sha256Framed({live.cpu_state()});
  at::Tensor bytes = at::empty({static_cast<int64_t>(digest.size())}, at::kByte);
  std::memcpy(bytes.data_ptr<uint8_t>(), digest.data(), digest.size());
  return bytes;
}

// Whether every member of `group` holds the same caller state.
absl::StatusOr<bool> CallerStatesAgree(collectives::Communicator& group,
                                       const rng::RankStreams& streams) {
  LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor mine, CallerDigest(streams));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> all, group.AllGather(mine));
  for (const at::Tensor& theirs : all) {
    if (!at::equal(theirs, mine)) return false;
  }
  return true;
}

// The next `n` model-stream draws (without changing the caller's state), gathered from every
// member of `group`.
absl::StatusOr<bool> ModelStreamsAgree(collectives::Communicator& group,
                                       rng::RankStreams& streams) {
  at::Tensor draws;
  {
    LOCKSTEP_ASSIGN_OR_RETURN(rng::ModelStreamScope scope, rng::ModelStreamScope::Enter(streams));
    draws = at::rand({4});
    LOCKSTEP_RETURN_IF_ERROR(scope.Exit());
  }
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> all, group.AllGather(draws));
  for (const at::Tensor& theirs : all) {
    if (!at::equal(theirs, draws)) return false;
  }
  return true;
}

// Runs every microbatch of one call through the stream (or all at once), calling `after` after
// each hand-back (the stream) or once after the call (all at once).
absl::Status RunCall(Rig& rig, bool use_stream, const std::function<absl::Status()>& after) {
  if (use_stream) {
    LOCKSTEP_ASSIGN_OR_RETURN(MicrobatchStream stream,
                              rig.trainer->ForwardMicrobatches(TrainerInputs::Of(Batch(), Rows())));
    while (true) {
      LOCKSTEP_ASSIGN_OR_RETURN(std::optional<MicrobatchOutput> out, stream.Next());
      if (!out) break;
      LOCKSTEP_RETURN_IF_ERROR(after());
    }
    return absl::OkStatus();
  }
  LOCKSTEP_RETURN_IF_ERROR(
      rig.trainer->ForwardAllMicrobatches(TrainerInputs::Of(Batch(), Rows())).status());
  return after();
}

// --- Contract 2: every forward failure agreed at once -------------------------------------------

// Where rank `rank` writes "<failure time> <error time>" (monotonic nanoseconds) for the parent.
std::string TimingPath(pid_t parent, int rank) {
  return absl::StrCat(::testing::TempDir(), "/failure_timing_", parent, "_", rank);
}

// Rank 1's forward fails (an error status, or an exception) on the second microbatch of the first
// call. Every rank must get the error promptly — rank 1 its own, rank 0 kAborted naming global
// rank 1 and its error — and then call again at once (rank 1 does not wait for its peer), and the
// second call must succeed on both with replicas still in step.
absl::Status FailureBody(int rank, collectives::Communicator& world, bool admission,
                         bool use_stream, bool throws) {
  int calls = 0;
  int64_t failed_at = 0;
  RigOptions options;
  options.admission = admission;
  options.forward = [&](Rig& rig, const ShardWork& work) -> absl::StatusOr<at::Tensor> {
    at::Tensor y = at::dropout(work.inputs * rig.w, 0.5, true);  // draws, then may fail
    if (rank == 1 && ++calls == 2) {
      failed_at = MonotonicNanos();
      if (throws) throw std::runtime_error("injected: the kernel failed");
      return absl::InternalError("injected: the kernel failed");
    }
    return y;
  };
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Rig> rig, MakeRig(rank, world, options));
  LOCKSTEP_ASSIGN_OR_RETURN(bool agree_before, ModelStreamsAgree(*rig->group, *rig->streams));
  LOCKSTEP_RETURN_IF_ERROR(Expect(agree_before, "model streams differ before the failure"));
  const absl::Status first = RunCall(*rig, use_stream, [] { return absl::OkStatus(); });
  const int64_t errored_at = MonotonicNanos();
  // Every replica must have failed, with what the contract names.
  if (rank == 1) {
    LOCKSTEP_RETURN_IF_ERROR(Expect(first.code() == absl::StatusCode::kInternal,
                                    absl::StrCat("rank 1 got ", first.ToString())));
  } else {
    LOCKSTEP_RETURN_IF_ERROR(
        Expect(first.code() == absl::StatusCode::kAborted &&
                   absl::StrContains(first.message(), "global rank 1 of the group failed it") &&
                   absl::StrContains(first.message(), "injected: the kernel failed"),
               absl::StrCat("rank 0 got ", first.ToString())));
  }
  LOCKSTEP_RETURN_IF_ERROR(
      Expect(absl::StrContains(first.message(), "microbatch 1"), first.ToString()));
  // The second call, at once: it must succeed on both, and the model streams still agree.
  LOCKSTEP_RETURN_IF_ERROR(RunCall(*rig, use_stream, [] { return absl::OkStatus(); }));
  LOCKSTEP_ASSIGN_OR_RETURN(bool agree_after, ModelStreamsAgree(*rig->group, *rig->streams));
  LOCKSTEP_RETURN_IF_ERROR(Expect(agree_after, "model streams differ after the failed call"));
  // Rank 1 tells rank 0 when it failed; each writes the delay to its own error.
  at::Tensor failure = at::full({1}, failed_at, at::kLong);
  LOCKSTEP_RETURN_IF_ERROR(rig->group->Broadcast(failure, 1));
  std::ofstream(TimingPath(getppid(), rank)) << failure.item<int64_t>() << " " << errored_at;
  return absl::OkStatus();
}

TEST(TrainerContractTest, AForwardFailingOnOneReplicaFailsEveryReplicaAtOnceAndTheNextCallWorks) {
  for (bool admission : {false, true}) {
    for (bool use_stream : {true, false}) {
      for (bool throws : {false, true}) {
        SCOPED_TRACE(absl::StrCat(admission ? "with" : "without", " admission, ",
                                  use_stream ? "the stream" : "all at once",
                                  throws ? ", an exception" : ", an error status"));
        collectives::ProcessWorldOptions options = collectives::ProcessWorldOptions::Of(2);
        options.collective_timeout = absl::Seconds(30);
        const std::vector<absl::Status> results =
            collectives::RunProcessWorld(options, [&](int rank, collectives::Communicator& world) {
              return FailureBody(rank, world, admission, use_stream, throws);
            });
        for (int r = 0; r < 2; ++r) {
          ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
          std::ifstream in(TimingPath(getpid(), r));
          int64_t failed_at = 0, errored_at = 0;
          in >> failed_at >> errored_at;
          const double delay_ms = static_cast<double>(errored_at - failed_at) / 1e6;
          std::printf("failure to rank %d's error: %.2f ms (%s admission, %s, %s)\n", r, delay_ms,
                      admission ? "with" : "without", use_stream ? "stream" : "all at once",
                      throws ? "exception" : "status");
          // Well under a second, against a collective timeout of 30 s.
          EXPECT_LT(delay_ms, 1000.0) << "rank " << r;
        }
      }
    }
  }
}

// --- Contract 3 and the hand-back rule
// ------------------------------------------------------------

// A caller draw on the leader only, between Create and the first forward (a leader-only log or
// sample): the model streams must still agree, so the replicas' forwards draw the same masks.
absl::Status LeaderDrawsAfterCreateBody(int rank, collectives::Communicator& world) {
  RigOptions options;
  options.seed_by_rank = false;
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Rig> rig, MakeRig(rank, world, options));
  if (rig->group->rank() == 0) (void)at::rand({5});  // the leader's own draw
  LOCKSTEP_ASSIGN_OR_RETURN(bool agree, ModelStreamsAgree(*rig->group, *rig->streams));
  LOCKSTEP_RETURN_IF_ERROR(Expect(agree, "the model streams differ after a leader-only draw"));
  // And through a forward: each replica's forward drew its own shard's masks from its own model
  // stream, and the streams still agree after it. (Comparing the gathered full outputs could not
  // fail here: at TP 1 every row has one owner, whose rows every member receives alike.)
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::vector<MicrobatchOutput> outs,
      rig->trainer->ForwardAllMicrobatches(TrainerInputs::Of(Batch(), Rows())));
  LOCKSTEP_RETURN_IF_ERROR(Expect(!outs.empty(), "no microbatch was handed back"));
  LOCKSTEP_ASSIGN_OR_RETURN(bool still, ModelStreamsAgree(*rig->group, *rig->streams));
  return Expect(still, "the model streams differ after a forward");
}

TEST(TrainerContractTest, TheModelStreamAgreesWhateverTheCallerDrawsAfterCreate) {
  for (const absl::Status& s : collectives::RunProcessWorld(collectives::ProcessWorldOptions::Of(2),
                                                            LeaderDrawsAfterCreateBody)) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

// Note [Planning draws nothing]: beginning a call (planning, agreement, admission) leaves the
// caller's generators and the model stream exactly as they were, and the microbatches' draws
// then come from the model stream as before.
absl::Status PlanningDrawsNothingBody(int rank, collectives::Communicator& world) {
  RigOptions options;
  options.admission = true;
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Rig> rig, MakeRig(rank, world, options));
  LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor caller_before, CallerDigest(*rig->streams));
  const std::optional<rng::RngSnapshot> model_before = rig->streams->model().state();
  LOCKSTEP_RETURN_IF_ERROR(Expect(model_before.has_value(), "no model stream after Create"));
  LOCKSTEP_ASSIGN_OR_RETURN(MicrobatchStream stream,
                            rig->trainer->ForwardMicrobatches(TrainerInputs::Of(Batch(), Rows())));
  LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor caller_after, CallerDigest(*rig->streams));
  LOCKSTEP_RETURN_IF_ERROR(
      Expect(at::equal(caller_before, caller_after), "ForwardMicrobatches moved the caller's RNG"));
  const std::optional<rng::RngSnapshot> model_after = rig->streams->model().state();
  LOCKSTEP_RETURN_IF_ERROR(
      Expect(model_after.has_value() && model_after->cpu_state() == model_before->cpu_state(),
             "ForwardMicrobatches moved the model stream"));
  // The first microbatch draws its mask from the model stream where it stood.
  LOCKSTEP_ASSIGN_OR_RETURN(std::optional<MicrobatchOutput> first, stream.Next());
  LOCKSTEP_RETURN_IF_ERROR(Expect(first.has_value(), "no microbatch"));
  LOCKSTEP_RETURN_IF_ERROR(
      Expect(rig->streams->model().state()->cpu_state() != model_before->cpu_state(),
             "the microbatch's dropout did not draw from the model stream"));
  LOCKSTEP_ASSIGN_OR_RETURN(bool agree, ModelStreamsAgree(*rig->group, *rig->streams));
  return Expect(agree, "the model streams differ across the replicas");
}

TEST(TrainerContractTest, BeginningACallLeavesBothStreamsWhereTheyWere) {
  for (const absl::Status& s : collectives::RunProcessWorld(collectives::ProcessWorldOptions::Of(2),
                                                            PlanningDrawsNothingBody)) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

// A model stream set before Create on each replica from its own state (an earlier scope) cannot
// be made to agree by Create: refused on every replica, naming the cause, instead of replicas
// drawing different masks.
absl::Status ModelStreamSetBeforeCreateBody(int rank, collectives::Communicator& world) {
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::Topology topology,
                            collectives::Topology::CreateExact(2, 1, 1, 2));
  std::shared_ptr<collectives::Communicator> group;
  LOCKSTEP_ASSIGN_OR_RETURN(group, world.NewGroup(topology.TpCpGroup(rank)));
  LOCKSTEP_ASSIGN_OR_RETURN(auto streams,
                            rng::RankStreams::Create(rng::DefaultGenerators::CpuOnly()));
  at::manual_seed(10 + rank);
  {
    LOCKSTEP_ASSIGN_OR_RETURN(rng::ModelStreamScope scope, rng::ModelStreamScope::Enter(*streams));
    LOCKSTEP_RETURN_IF_ERROR(scope.Exit());
  }
  const absl::Status created =
      TrainerRank::Create(
          TrainerConfig::Of(8), TrainerRank::Collaborators::Of(topology, rank, group, streams),
          [](const ShardWork& work) -> absl::StatusOr<at::Tensor> { return work.inputs; })
          .status();
  return Expect(created.code() == absl::StatusCode::kFailedPrecondition &&
                    absl::StrContains(created.message(), "the model stream was set before Create"),
                created.ToString());
}

TEST(TrainerContractTest, AModelStreamSetBeforeCreateThatDiffersIsRefused) {
  for (const absl::Status& s : collectives::RunProcessWorld(collectives::ProcessWorldOptions::Of(2),
                                                            ModelStreamSetBeforeCreateBody)) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

// Between hand-backs the replicas draw differently (the leader one extra sample, as a leader that
// logs does); right after every hand-back their caller states must be bit-identical, on both
// forward paths; DP workers (seeded differently) must stay distinct. With the synchronization of
// that path turned off (the negative control), the check must fail.
absl::Status DivergingDrawsBody(int rank, collectives::Communicator& world, bool use_stream,
                                bool control) {
  RigOptions options;
  options.dp = 2;
  options.cp = 2;
  if (control) {
    options.seams.synchronize_after_each_microbatch = !use_stream;
    options.seams.synchronize_after_all_microbatches = use_stream;
  }
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Rig> rig, MakeRig(rank, world, options));
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<collectives::Communicator> dp_group,
                            world.NewGroup(rig->topology.DpGroup(rank)));
  int hand_backs = 0;
  auto after = [&]() -> absl::Status {
    ++hand_backs;
    LOCKSTEP_ASSIGN_OR_RETURN(bool replicas_agree, CallerStatesAgree(*rig->group, *rig->streams));
    LOCKSTEP_RETURN_IF_ERROR(
        Expect(replicas_agree, absl::StrCat("caller states differ after hand-back ", hand_backs)));
    LOCKSTEP_ASSIGN_OR_RETURN(bool dp_agree, CallerStatesAgree(*dp_group, *rig->streams));
    LOCKSTEP_RETURN_IF_ERROR(Expect(!dp_agree, "DP workers' caller states became equal"));
    // Diverge again before the next hand-back: the leader draws once more.
    if (rig->group->rank() == 0) (void)at::rand({3});
    return absl::OkStatus();
  };
  for (int call = 0; call < 2; ++call) LOCKSTEP_RETURN_IF_ERROR(RunCall(*rig, use_stream, after));
  return Expect(hand_backs == (use_stream ? 4 : 2), absl::StrCat(hand_backs, " hand-backs"));
}

TEST(TrainerContractTest,
     EveryHandBackRepairsDivergedCallerStatesOnBothPathsAndDpWorkersStayDistinct) {
  for (bool use_stream : {true, false}) {
    SCOPED_TRACE(use_stream ? "the stream" : "all at once");
    for (const absl::Status& s : collectives::RunProcessWorld(
             collectives::ProcessWorldOptions::Of(4), [&](int rank, collectives::Communicator&w) {
               return DivergingDrawsBody(rank, w, use_stream, false);
             })) {
      EXPECT_TRUE(s.ok()) << s;
    }
    // Negative control: that path's synchronization off; the divergence must show.
    int detected = 0;
    for (const absl::Status& s : collectives::RunProcessWorld(
             collectives::ProcessWorldOptions::Of(4), [&](int rank, collectives::Communicator&w) {
               return DivergingDrawsBody(rank, w, use_stream, true);
             })) {
      detected += absl::StrContains(s.message(), "caller states differ after hand-back");
    }
    EXPECT_GT(detected, 0) << "the missing synchronization went unnoticed";
  }
}

// Caller states reseeded differently on the replicas after RegisterCustomObject, before the first
// forward: the first hand-back repairs them.
absl::Status ReseededAfterRegistrationBody(int rank, collectives::Communicator& world) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Rig> rig, MakeRig(rank, world, RigOptions()));
  LOCKSTEP_RETURN_IF_ERROR(
      rig->trainer
          ->RegisterCustomObject("head", "v1",
                                 []() -> absl::StatusOr<numerics::NamedTensors> {
                                   return numerics::NamedTensors{{"w", at::randn({2})}};
                                 })
          .status());
  at::manual_seed(77 + rank);  // each replica reseeds on its own
  return RunCall(*rig, true, [&]() -> absl::Status {
    LOCKSTEP_ASSIGN_OR_RETURN(bool agree, CallerStatesAgree(*rig->group, *rig->streams));
    return Expect(agree, "the hand-back did not repair the reseeded caller states");
  });
}

TEST(TrainerContractTest, CallerStatesReseededAfterRegistrationAreRepairedAtTheHandBack) {
  for (const absl::Status& s : collectives::RunProcessWorld(collectives::ProcessWorldOptions::Of(2),
                                                            ReseededAfterRegistrationBody)) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

// --- Contract 5: custom objects ----------------------------------------------------------------

absl::Status CustomObjectsBody(int rank, collectives::Communicator& world) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Rig> rig, MakeRig(rank, world, RigOptions()));
  TrainerRank& trainer = *rig->trainer;
  const bool other = rig->group->rank() == 1;
  // Another shape on one replica: refused on both, naming rank 1 and the shape; nothing registered.
  absl::Status shape =
      trainer
          .RegisterCustomObject(
              "head", "linear",
              [&]() -> absl::StatusOr<numerics::NamedTensors> {
                return numerics::NamedTensors{
                    {"w", at::randn(other ? at::IntArrayRef{4, 3} : at::IntArrayRef{3, 4})}};
              })
          .status();
  LOCKSTEP_RETURN_IF_ERROR(
      Expect(shape.code() == absl::StatusCode::kFailedPrecondition &&
                 absl::StrContains(shape.message(),
                                   "global rank 1's factory returned tensor 0 ('w') "
                                   "with shape [4, 3], the leader's (global rank 0) "
                                   "[3, 4]") &&
                 absl::StrContains(shape.message(), "nothing registered"),
             absl::StrCat("shape: ", shape.ToString())));
  // Another dtype: the same, naming the dtype.
  absl::Status dtype =
      trainer
          .RegisterCustomObject("head", "linear",
                                [&]() -> absl::StatusOr<numerics::NamedTensors> {
                                  return numerics::NamedTensors{
                                      {"w", at::randn({3, 4}, other ? at::kDouble : at::kFloat)}};
                                })
          .status();
  LOCKSTEP_RETURN_IF_ERROR(
      Expect(dtype.code() == absl::StatusCode::kFailedPrecondition &&
                 absl::StrContains(dtype.message(),
                                   "with dtype Double, the leader's (global rank "
                                   "0) Float"),
             absl::StrCat("dtype: ", dtype.ToString())));
  // A factory failing on one replica: refused on both; the caller's draws undone.
  LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor before, CallerDigest(*rig->streams));
  absl::Status failing = trainer
                             .RegisterCustomObject("head", "linear",
                                                   [&]() -> absl::StatusOr<numerics::NamedTensors> {
                                                     at::Tensor w = at::randn({3, 4});
                                                     if (other) return absl::InternalError("no");
                                                     return numerics::NamedTensors{{"w", w}};
                                                   })
                             .status();
  LOCKSTEP_RETURN_IF_ERROR(Expect(!failing.ok(), "a failing factory registered"));
  LOCKSTEP_RETURN_IF_ERROR(Expect(other ? failing.code() == absl::StatusCode::kInternal
                                        : failing.code() == absl::StatusCode::kAborted &&
                                              absl::StrContains(failing.message(), "global rank 1"),
                                  absl::StrCat("failing factory: ", failing.ToString())));
  // The registration synchronized the callers to the leader's state, and the factory's draw was
  // undone: every replica now holds the leader's state from before the registration.
  LOCKSTEP_RETURN_IF_ERROR(rig->group->Broadcast(before, 0));
  LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor after_failure, CallerDigest(*rig->streams));
  LOCKSTEP_RETURN_IF_ERROR(Expect(at::equal(after_failure, before),
                                  "a failed registration left the factory's draws in the caller"));
  // Now a good registration, its values the leader's; then the same again returns the first
  // object without running the factory; another kind under the name is refused.
  int factory_runs = 0;
  LOCKSTEP_ASSIGN_OR_RETURN(
      numerics::NamedTensors head,
      trainer.RegisterCustomObject(
          "head", "linear", [&]() -> absl::StatusOr<numerics::NamedTensors> {
            ++factory_runs;
            return numerics::NamedTensors{{"w", at::full({3, 4}, other ? 2.0 : 1.0)}};
          }));
  LOCKSTEP_RETURN_IF_ERROR(
      Expect(at::equal(head[0].second, at::ones({3, 4})), "the leader's values did not win"));
  LOCKSTEP_ASSIGN_OR_RETURN(numerics::NamedTensors again,
                            trainer.RegisterCustomObject(
                                "head", "linear", [&]() -> absl::StatusOr<numerics::NamedTensors> {
                                  ++factory_runs;
                                  return numerics::NamedTensors{{"w", at::zeros({3, 4})}};
                                }));
  LOCKSTEP_RETURN_IF_ERROR(Expect(factory_runs == 1 && again[0].second.is_same(head[0].second),
                                  "registering twice did not return the first object"));
  // A non-contiguous tensor (a transposed view) receives the leader's values in place.
  LOCKSTEP_ASSIGN_OR_RETURN(
      numerics::NamedTensors transposed,
      trainer.RegisterCustomObject(
          "head_t", "linear", [&]() -> absl::StatusOr<numerics::NamedTensors> {
            return numerics::NamedTensors{{"w", at::full({4, 3}, other ? 2.0 : 1.0).t()}};
          }));
  LOCKSTEP_RETURN_IF_ERROR(Expect(
      !transposed[0].second.is_contiguous() && at::equal(transposed[0].second, at::ones({3, 4})),
      "a non-contiguous object did not receive the leader's values"));
  absl::Status kind = trainer
                          .RegisterCustomObject("head", "conv",
                                                []() -> absl::StatusOr<numerics::NamedTensors> {
                                                  return numerics::NamedTensors{};
                                                })
                          .status();
  return Expect(kind.code() == absl::StatusCode::kAlreadyExists &&
                    absl::StrContains(kind.message(), "registered already with metadata 'linear'"),
                absl::StrCat("another kind: ", kind.ToString()));
}

TEST(TrainerContractTest, CustomObjectsAreComparedStructurallyAndRegisteredAllOrNothing) {
  for (const absl::Status& s :
       collectives::RunProcessWorld(collectives::ProcessWorldOptions::Of(2), CustomObjectsBody)) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

// --- Forwards without gradients, and rank-dependent model-stream draws ---------------------------

// Under NoGradGuard, and with a frozen parameter: outputs equal the unsplit y = x * w, nothing
// requires grad, every rank finishes.
absl::Status NoGradBody(int rank, collectives::Communicator& world, bool no_grad_guard) {
  RigOptions options;
  options.forward = [](Rig& rig, const ShardWork& work) -> absl::StatusOr<at::Tensor> {
    return work.inputs * rig.w;
  };
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Rig> rig, MakeRig(rank, world, options));
  if (!no_grad_guard) rig->w.requires_grad_(false);
  const at::Tensor rows = Rows();
  for (bool use_stream : {true, false}) {
    std::optional<at::AutoGradMode> guard;  // NoGradGuard's effect, in both LibTorch versions
    if (no_grad_guard) guard.emplace(false);
    std::vector<MicrobatchOutput> outs;
    if (use_stream) {
      LOCKSTEP_ASSIGN_OR_RETURN(MicrobatchStream stream, rig->trainer->ForwardMicrobatches(
                                                             TrainerInputs::Of(Batch(), rows)));
      while (true) {
        LOCKSTEP_ASSIGN_OR_RETURN(std::optional<MicrobatchOutput> out, stream.Next());
        if (!out) break;
        outs.push_back(*out);
      }
    } else {
      LOCKSTEP_ASSIGN_OR_RETURN(
          outs, rig->trainer->ForwardAllMicrobatches(TrainerInputs::Of(Batch(), rows)));
    }
    for (const MicrobatchOutput& out : outs) {
      LOCKSTEP_RETURN_IF_ERROR(Expect(!out.outputs.requires_grad(), "an output requires grad"));
      LOCKSTEP_RETURN_IF_ERROR(
          Expect(at::equal(out.outputs, rows.index_select(0, out.input_rows) * rig->w.detach()),
                 "an output differs from the unsplit reference"));
    }
  }
  return absl::OkStatus();
}

TEST(TrainerContractTest, ForwardsWithoutGradientsMatchTheReferenceOnEveryRank) {
  for (bool no_grad_guard : {true, false}) {
    SCOPED_TRACE(no_grad_guard ? "NoGradGuard" : "frozen parameters");
    for (const absl::Status& s : collectives::RunProcessWorld(
             collectives::ProcessWorldOptions::Of(2), [&](int rank, collectives::Communicator&w) {
               return NoGradBody(rank, w, no_grad_guard);
             })) {
      EXPECT_TRUE(s.ok()) << s;
    }
  }
}

// A model that draws a rank-dependent amount from the model stream (rank-dependent control flow,
// outside the model stream's agreement): the caller's draws still agree after every hand-back and
// the outputs (which do not use those draws) still match the reference.
absl::Status RankDependentDrawsBody(int rank, collectives::Communicator& world) {
  RigOptions options;
  options.forward = [rank](Rig& rig, const ShardWork& work) -> absl::StatusOr<at::Tensor> {
    (void)at::rand({1 + 3 * rank});
    return work.inputs * rig.w;
  };
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Rig> rig, MakeRig(rank, world, options));
  const at::Tensor rows = Rows();
  LOCKSTEP_ASSIGN_OR_RETURN(MicrobatchStream stream,
                            rig->trainer->ForwardMicrobatches(TrainerInputs::Of(Batch(), rows)));
  while (true) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::optional<MicrobatchOutput> out, stream.Next());
    if (!out) break;
    LOCKSTEP_ASSIGN_OR_RETURN(bool agree, CallerStatesAgree(*rig->group, *rig->streams));
    LOCKSTEP_RETURN_IF_ERROR(Expect(agree, "caller states differ after a hand-back"));
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> masks,
                              rig->group->AllGather(at::bernoulli(at::full({8}, 0.5))));
    LOCKSTEP_RETURN_IF_ERROR(Expect(at::equal(masks[0], masks[1]), "caller masks differ"));
    LOCKSTEP_RETURN_IF_ERROR(Expect(
        at::equal(out->outputs.detach(), rows.index_select(0, out->input_rows) * rig->w.detach()),
        "an output differs from the reference"));
  }
  return absl::OkStatus();
}

TEST(TrainerContractTest, RankDependentModelStreamDrawsLeaveCallerDrawsAndOutputsIntact) {
  for (const absl::Status& s : collectives::RunProcessWorld(collectives::ProcessWorldOptions::Of(2),
                                                            RankDependentDrawsBody)) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

}  // namespace
}  // namespace trainer
}  // namespace lockstep
