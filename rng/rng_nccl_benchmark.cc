// gpu (two or more GPUs): the RNG cost of one hand-back point on a TP x CP rank over NCCL — one
// model-stream scope (enter + exit, CPU + CUDA generators) plus Synchronize of the CPU and CUDA
// state across the group — against a bare NcclCommunicator broadcast of the same bytes, in the
// same run. One process per GPU; prints per-iteration times and the ratio. With fewer than two
// GPUs it says so and exits 0 without measuring.
//
//   rng_nccl_benchmark [iterations]     (default 2000, after 200 warm-up iterations)

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/subprocess.h"
#include "collectives/nccl_communicator.h"
#include "collectives/rendezvous.h"
#include "cuda_runtime_api.h"
#include "rng/rank_streams.h"
#include "rng/snapshot.h"
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
  const DefaultGenerators generators = DefaultGenerators::WithCudaDevice(rank);
  at::manual_seed(100 + rank);
  absl::StatusOr<std::shared_ptr<RankStreams>> streams = RankStreams::Create(generators);
  if (!streams.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, streams.status().ToString().c_str());
    return 1;
  }
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
    {
      absl::StatusOr<ModelStreamScope> scope = ModelStreamScope::Enter(**streams);
      ok = ok && scope.ok() && scope->Exit().ok();
    }
    ok = ok && Synchronize(comm->get(), **streams).ok();
  });
  const double sync_only = time_loop([&] { ok = ok && Synchronize(comm->get(), **streams).ok(); });
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
  int gpus = 0;
  {
    absl::StatusOr<lockstep::Child> counter =
        lockstep::Child::Fork(lockstep::ChildOptions::Reporting(), [](int channel) {
          int count = 0;
          if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
          return write(channel, &count, sizeof(count)) == sizeof(count) ? 0 : 1;
        });
    if (!counter.ok()) {
      std::fprintf(stderr, "rng_nccl_benchmark: %s\n", counter.status().ToString().c_str());
      return 1;
    }
    std::string report;
    while (lockstep::PollChannels({&*counter}, absl::Seconds(60), [&](size_t, absl::string_view b) {
             report.append(b.data(), b.size());
           }).value_or(0) > 0) {
    }
    counter->Reap();
    if (report.size() == sizeof(gpus)) std::memcpy(&gpus, report.data(), sizeof(gpus));
  }
  if (gpus < 2) {
    std::printf("rng_nccl_benchmark: needs at least 2 GPUs; this machine has %d: not measured\n",
                gpus);
    return 0;
  }
  const int world = 2;
  const std::string store = absl::StrCat("/tmp/lockstep_rng_nccl_", getpid());
  std::vector<lockstep::Child> ranks;
  for (int rank = 0; rank < world; ++rank) {
    absl::StatusOr<lockstep::Child> child = lockstep::Child::Fork(
        lockstep::ChildOptions::Reporting(),
        [&, rank](int) { return lockstep::rng::RunRank(store, rank, world, iterations); });
    if (!child.ok()) {
      std::fprintf(stderr, "rng_nccl_benchmark: starting rank %d: %s\n", rank,
                   child.status().ToString().c_str());
      return 1;
    }
    ranks.push_back(std::move(*child));
  }
  int failed = 0;
  for (int rank = 0; rank < world; ++rank) {
    ranks[rank].Reap();
    if (!ranks[rank].succeeded()) {
      std::fprintf(stderr, "rng_nccl_benchmark: rank %d %s\n", rank,
                   ranks[rank].Describe().c_str());
      ++failed;
    }
  }
  return failed == 0 ? 0 : 1;
}
