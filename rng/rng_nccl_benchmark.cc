// gpu (two or more GPUs): the RNG cost of one hand-back point on a TP x CP rank over NCCL — one
// model-stream scope (enter + exit, CPU + CUDA generators) plus Synchronize of the CPU and CUDA
// state across the group — against a bare NcclCommunicator broadcast of the same bytes, in the
// same run. One process per GPU; prints per-iteration times and the ratio. With fewer than two
// GPUs it says so and exits 0 without measuring.
//
//   rng_nccl_benchmark [iterations]     (default 2000, after 200 warm-up iterations)

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectives/nccl_communicator.h"
#include "collectives/rendezvous.h"
#include "cuda_runtime_api.h"
#include "rng/generator_state.h"
#include "rng/model_stream.h"
#include "rng/synchronize.h"

namespace lockstep {
namespace rng {
namespace {

// Runs rank `rank` of `world`; rank 0 prints the results. Returns the exit code.
int RunRank(const std::string& store, int rank, int world, int iterations) {
  auto rendezvous = collectives::Rendezvous::File(store, rank, world, absl::Seconds(60));
  if (!rendezvous.ok()) return 1;
  collectives::NcclCommunicator::Options options;
  options.device = rank;
  auto comm = collectives::NcclCommunicator::Create(*rendezvous, options);
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    return 1;
  }
  const DefaultGenerators generators{.cuda_device = rank};
  at::manual_seed(100 + rank);
  ModelStream model(generators);
  const int64_t bytes = static_cast<int64_t>(SynchronizeWireBytes(generators));
  at::Tensor payload = at::zeros({bytes}, at::kByte);

  auto time_loop = [&](auto&& body) -> double {
    for (int i = 0; i < 200; ++i) body();
    if (!(*comm)->Barrier().ok()) return -1;
    const absl::Time start = absl::Now();
    for (int i = 0; i < iterations; ++i) body();
    if (!(*comm)->Barrier().ok()) return -1;
    return absl::ToDoubleMicroseconds(absl::Now() - start) / iterations;
  };
  bool ok = true;
  const double bare = time_loop([&] { ok = ok && (*comm)->Broadcast(payload, 0).ok(); });
  const double scope_and_sync = time_loop([&] {
    { ModelStreamScope scope(model); }
    ok = ok && Synchronize(comm->get(), generators).ok();
  });
  const double sync_only = time_loop([&] { ok = ok && Synchronize(comm->get(), generators).ok(); });
  if (!ok || bare < 0 || scope_and_sync < 0 || sync_only < 0) return 1;
  if (rank == 0) {
    std::printf("NCCL world of %d GPUs, %lld-byte RNG state, %d iterations\n", world,
                static_cast<long long>(bytes), iterations);
    std::printf("bare broadcast (CPU tensor staged through the GPU): %.1f us\n", bare);
    std::printf("Synchronize:                                         %.1f us\n", sync_only);
    std::printf("model-stream scope + Synchronize:                    %.1f us\n", scope_and_sync);
    std::printf("ratio synchronize / bare broadcast: %.3f (target <= 1.2: %s)\n", sync_only / bare,
                sync_only / bare <= 1.2 ? "met" : "NOT met");
    std::printf("scope + synchronize vs the 80 us anchor: %.3f\n", scope_and_sync / 80.0);
    std::fflush(stdout);  // the rank exits with _exit, which does not flush
  }
  return 0;
}

}  // namespace
}  // namespace rng
}  // namespace lockstep

int main(int argc, char** argv) {
  int iterations = 2000;
  if (argc > 1 && (!absl::SimpleAtoi(argv[1], &iterations) || iterations <= 0)) {
    std::fprintf(stderr, "usage: rng_nccl_benchmark [iterations > 0]\n");
    return 2;
  }
  // Count GPUs in a child, so this process forks the ranks before touching CUDA.
  int fds[2];
  if (pipe(fds) != 0) return 1;
  if (fork() == 0) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    (void)!write(fds[1], &count, sizeof(count));
    _exit(0);
  }
  int gpus = 0;
  if (read(fds[0], &gpus, sizeof(gpus)) != sizeof(gpus)) gpus = 0;
  wait(nullptr);
  if (gpus < 2) {
    std::printf("rng_nccl_benchmark: needs at least 2 GPUs; this machine has %d: not measured\n",
                gpus);
    return 0;
  }
  const int world = 2;
  const std::string store = absl::StrCat("/tmp/lockstep_rng_nccl_", getpid());
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) _exit(lockstep::rng::RunRank(store, rank, world, iterations));
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  return failed == 0 ? 0 : 1;
}
