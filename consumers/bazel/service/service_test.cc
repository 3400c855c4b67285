// The service against lockstep's public targets: plan sizes, the caller's RNG left alone by the
// model stream, two real processes drawing the same numbers over Gloo, and a checkpointed
// dropout's gradient equal to the plain one.
#include "service/service.h"

#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/posix_io.h"
#include "base/status_testutil.h"
#include "collectives/gloo_communicator.h"
#include "collectives/rendezvous.h"
#include "gtest/gtest.h"
#include "numerics/compare.h"
#include "planner/planner.h"
#include "rng/generators.h"
#include "rng/rank_streams.h"

extern char** environ;

namespace service {
namespace {

using lockstep::collectives::GlooCommunicator;
using lockstep::collectives::Rendezvous;
using lockstep::numerics::CompareTensors;
using lockstep::numerics::TensorComparison;
using lockstep::numerics::Tolerance;
using lockstep::rng::DefaultGenerators;
using lockstep::rng::RankStreams;

void ExpectBitwiseEqual(const at::Tensor& actual, const at::Tensor& expected) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(TensorComparison c,
                                CompareTensors(actual, expected, Tolerance::Bitwise()));
  EXPECT_TRUE(c.passed) << c.Summary();
}

// --- 1. Planning ----------------------------------------------------------------------------

TEST(PlanStepTest, SequencesThatFillTheBudgetGetOneMicrobatchEach) {
  // Every sequence is exactly the budget: no two fit together, whatever the packing.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(lockstep::planner::Plan plan, PlanStep({512, 512, 512}, 512));
  ASSERT_EQ(plan.microbatches_size(), 3);
  for (const lockstep::planner::Microbatch& mb : plan.microbatches()) {
    EXPECT_EQ(mb.num_tokens(), 512);
  }
}

TEST(PlanStepTest, PairsThatSumToTheBudgetShareAMicrobatch) {
  // 2048 tokens under a 1024 budget need at least 2 microbatches; 700 + 324 fills one exactly,
  // twice (first-fit-decreasing and in-order filling agree), over 2 CP ranks.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(lockstep::planner::Plan plan,
                                PlanStep({700, 324, 700, 324}, 1024, /*cp_size=*/2));
  ASSERT_EQ(plan.microbatches_size(), 2);
  EXPECT_EQ(plan.num_tokens(), 2048);
  for (const lockstep::planner::Microbatch& mb : plan.microbatches()) {
    EXPECT_EQ(mb.num_tokens(), 1024);
    EXPECT_EQ(mb.batch_index_size(), 2);
    EXPECT_EQ(mb.shard_num_tokens_size(), 2);  // one shard entry per CP rank
  }
}

TEST(PlanStepTest, ASequenceOverTheBudgetIsRefused) {
  EXPECT_EQ(PlanStep({513}, 512).status().code(), absl::StatusCode::kInvalidArgument);
}

// --- 2. The caller's RNG around a model-stream scope -----------------------------------------

at::Tensor CpuGeneratorState() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void SetCpuGeneratorState(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

TEST(ModelNoiseTest, LeavesTheCallersGeneratorExactlyAsItWas) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<RankStreams> streams,
                                RankStreams::Create(DefaultGenerators::CpuOnly()));
  at::manual_seed(42);
  (void)at::rand({5});
  const at::Tensor before = CpuGeneratorState();
  const at::Tensor callers_next = at::rand({8});
  SetCpuGeneratorState(before);

  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor noise, ModelNoise(*streams, 1000));
  EXPECT_FALSE(streams->model().in_scope());
  EXPECT_TRUE(streams->caller_state_live());
  EXPECT_TRUE(at::equal(CpuGeneratorState(), before)) << "the caller's generator state moved";
  ExpectBitwiseEqual(at::rand({8}), callers_next);
  // The noise came from the model stream, not from the caller's sequence.
  EXPECT_FALSE(at::equal(noise.slice(0, 0, 8), callers_next));

  // The model stream continues across scopes instead of replaying the same noise.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor more_noise, ModelNoise(*streams, 1000));
  EXPECT_FALSE(at::equal(more_noise, noise));
}

// The same on the GPU (skipped without one): the caller's CUDA generator is left exactly as it
// was, the model stream advances. Built against a CUDA LibTorch, it runs the CUDA parts of
// lockstep's RNG streams from the consumer's side.
TEST(ModelNoiseTest, OnTheGpuLeavesTheCallersCudaGeneratorExactlyAsItWas) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device (or a CPU-only LibTorch)";
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<RankStreams> streams,
                                RankStreams::Create(DefaultGenerators::WithCudaDevice(0)));
  const c10::Device cuda(c10::kCUDA, 0);
  at::manual_seed(42);
  (void)at::rand({5}, at::device(cuda));
  const at::Tensor callers_next = at::rand({8}, at::device(cuda));
  at::manual_seed(42);
  (void)at::rand({5}, at::device(cuda));

  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor noise, ModelNoise(*streams, 1000, cuda));
  EXPECT_TRUE(noise.is_cuda());
  EXPECT_TRUE(streams->caller_state_live());
  ExpectBitwiseEqual(at::rand({8}, at::device(cuda)).cpu(), callers_next.cpu());
  EXPECT_FALSE(at::equal(noise.slice(0, 0, 8).cpu(), callers_next.cpu()));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor more_noise, ModelNoise(*streams, 1000, cuda));
  EXPECT_FALSE(at::equal(more_noise.cpu(), noise.cpu()));
}

// --- 3. Synchronized draws in two processes over Gloo ----------------------------------------

// The second process is this test binary again, run with only this test and these variables.
constexpr char kPeerRankVariable[] = "SERVICE_TEST_PEER_RANK";
constexpr char kPeerPortVariable[] = "SERVICE_TEST_PEER_PORT";
constexpr char kSyncTestName[] = "SynchronizedDrawTest.TwoProcessesDrawBitwiseEqualNumbers";
const absl::Duration kTimeout = absl::Seconds(30);

// What a rank keeps until its peer is done: rank 0's rendezvous serves the store that both
// ranks' heartbeats use.
struct RankWorld {
  std::shared_ptr<Rendezvous> rendezvous;
  std::unique_ptr<GlooCommunicator> comm;
};

// One rank of the 2-process world: a TCP store on 127.0.0.1:port, a Gloo world, then the draws.
void RunRank(int rank, int port, RankWorld& kept) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      kept.rendezvous, Rendezvous::Tcp("127.0.0.1", port, rank, /*world_size=*/2, kTimeout));
  GlooCommunicator::Options options;
  options.timeout = kTimeout;
  options.hostname = "127.0.0.1";
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(kept.comm, GlooCommunicator::Create(kept.rendezvous, options));
  GlooCommunicator* world = kept.comm.get();
  ASSERT_EQ(world->rank(), rank);
  ASSERT_EQ(world->size(), 2);

  // Differently seeded and advanced: unsynchronized, the ranks draw different numbers.
  at::manual_seed(1000 + rank);
  (void)at::rand({rank + 1});
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::vector<at::Tensor> unsynced, world->AllGather(at::rand({64})));
  ASSERT_EQ(unsynced.size(), 2u);
  EXPECT_FALSE(at::equal(unsynced[0], unsynced[1])) << "the negative control drew equal numbers";

  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<RankStreams> streams,
                                RankStreams::Create(DefaultGenerators::CpuOnly()));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor draws, SynchronizedDraw(world, *streams, 64));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::vector<at::Tensor> gathered, world->AllGather(draws));
  ASSERT_EQ(gathered.size(), 2u);
  ExpectBitwiseEqual(gathered[rank], draws);
  ExpectBitwiseEqual(gathered[1], gathered[0]);
  // Neither rank leaves while the other may still be reading from it.
  LOCKSTEP_EXPECT_OK(world->Barrier());
}

// The environment of the peer: this one without Bazel's per-test output files (the peer must
// not write the parent's XML report or remove its premature-exit marker), plus the peer's rank
// and the store's port.
std::vector<std::string> PeerEnvironment(int port) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (absl::StartsWith(entry, "XML_OUTPUT_FILE=") || absl::StartsWith(entry, "GTEST_OUTPUT=") ||
        absl::StartsWith(entry, "TEST_PREMATURE_EXIT_FILE=") ||
        absl::StartsWith(entry, "TEST_SHARD_STATUS_FILE=") ||
        absl::StartsWith(entry, "TEST_TOTAL_SHARDS=") ||
        absl::StartsWith(entry, "TEST_SHARD_INDEX=") ||
        absl::StartsWith(entry, "GTEST_TOTAL_SHARDS=") ||
        absl::StartsWith(entry, "GTEST_SHARD_INDEX=")) {
      continue;
    }
    env.push_back(entry);
  }
  env.push_back(absl::StrCat(kPeerRankVariable, "=1"));
  env.push_back(absl::StrCat(kPeerPortVariable, "=", port));
  return env;
}

// Kills (unless reaped) and reaps the peer when the test ends early.
struct PeerGuard {
  pid_t pid = -1;
  ~PeerGuard() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

TEST(SynchronizedDrawTest, TwoProcessesDrawBitwiseEqualNumbers) {
  const char* peer_rank = std::getenv(kPeerRankVariable);
  const char* peer_port = std::getenv(kPeerPortVariable);
  if (peer_rank != nullptr && peer_port != nullptr) {  // this is the peer (rank 1)
    int rank = 0, port = 0;
    ASSERT_TRUE(absl::SimpleAtoi(peer_rank, &rank) && absl::SimpleAtoi(peer_port, &port));
    RankWorld kept;
    RunRank(rank, port, kept);
    return;
  }

  LOCKSTEP_ASSERT_OK_AND_ASSIGN(int port, lockstep::FreeLoopbackPort());
  char self[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof(self) - 1), 0) << "cannot find this binary";
  std::vector<std::string> args = {self, absl::StrCat("--gtest_filter=", kSyncTestName)};
  std::vector<std::string> env = PeerEnvironment(port);
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  RankWorld kept;  // destroyed after the peer is reaped (declared before the guard)
  PeerGuard peer;
  ASSERT_EQ(posix_spawn(&peer.pid, argv[0], nullptr, nullptr, argv.data(), envp.data()), 0)
      << "cannot start the peer process";

  RunRank(/*rank=*/0, port, kept);
  if (HasFatalFailure()) return;  // the guard kills the peer rather than wait out its timeouts

  int wait_status = 0;
  ASSERT_EQ(waitpid(peer.pid, &wait_status, 0), peer.pid);
  peer.pid = -1;
  EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0)
      << "the peer (rank 1) failed; its output is above (wait status " << wait_status << ")";
}

// --- 4. Checkpointed dropout ----------------------------------------------------------------

struct DropoutStep {
  at::Tensor output;
  at::Tensor input_grad;
};

// Seeds, draws the input, runs dropout plainly or checkpointed, draws between forward and
// backward (a recompute that did not replay the forward's RNG would see another mask), then
// backpropagates a weighted sum.
DropoutStep RunDropout(bool checkpointed, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor x = at::randn({32, 16}).requires_grad_();
  at::Tensor y;
  if (checkpointed) {
    absl::StatusOr<at::Tensor> out = CheckpointedDropout(x, 0.5);
    if (!out.ok()) {
      ADD_FAILURE() << out.status();
      return {};
    }
    y = *out;
  } else {
    y = at::dropout(x, 0.5, /*train=*/true);
  }
  (void)at::rand({100});
  (y * at::linspace(-1.0, 2.0, y.numel()).reshape(y.sizes())).sum().backward();
  return {y.detach(), x.grad().clone()};
}

TEST(CheckpointedDropoutTest, GradientEqualsThePlainDropoutsBitForBit) {
  const DropoutStep plain = RunDropout(/*checkpointed=*/false, /*seed=*/7);
  const DropoutStep recomputed = RunDropout(/*checkpointed=*/true, /*seed=*/7);
  ASSERT_TRUE(plain.input_grad.defined() && recomputed.input_grad.defined());
  ExpectBitwiseEqual(recomputed.output, plain.output);
  ExpectBitwiseEqual(recomputed.input_grad, plain.input_grad);

  // The mask is real (some gradients dropped, some kept), and depends on the seed: equal
  // gradients above are not a property of every pair of runs.
  const int64_t dropped = (plain.input_grad == 0).sum().item<int64_t>();
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, plain.input_grad.numel());
  const DropoutStep other_seed = RunDropout(/*checkpointed=*/true, /*seed=*/8);
  ASSERT_TRUE(other_seed.input_grad.defined());
  EXPECT_FALSE(at::equal(other_seed.input_grad, plain.input_grad));
}

}  // namespace
}  // namespace service
