// gpu (two or more GPUs): the RNG cost of one hand-back point of a TP x CP rank over NCCL — one
// model-stream scope (enter + exit, CPU + CUDA generators) plus Synchronize of the CPU and CUDA
// state across the group — with one process per GPU and the group of all GPUs, against what
// moving the same bytes costs:
//   floor_device   plain NCCL (a blocking communicator of its own): ncclBroadcast of a device
//                  buffer + stream synchronize
//   floor_staged   plain NCCL: memcpy into pinned memory + host-to-device copy + ncclBroadcast +
//                  device-to-host copy + stream synchronize
//   bare_lane      lockstep's NcclCommunicator (defaults) broadcasting a CPU tensor of
//                  Synchronize's size: all GPUs share this host, so it takes the host lane
//                  (shared memory, Note [Host lane] in collectives/nccl_communicator.cc)
//   bare_mapped    the same with the host lane off: through NCCL, zero-copy from mapped host
//                  memory
//   bare_copies    the same with the host lane off, staged through device copies
//   synchronize    rng::Synchronize over lockstep's communicator (defaults: the host lane)
//   scope          rng::ModelStreamScope enter + exit (no communication)
//   handback       scope + Synchronize: the figure the <= 20 us target is stated in
//   handback_nccl  scope + Synchronize with the host lane off (the bytes cross the GPUs)
// Every operation runs once per iteration in one loop (paired: all see the same machine state),
// each timed on its own; medians of --iterations after --warmup iterations are printed by rank 0,
// with the ratios, and a last line HANDBACK_US=<median> for tools/bench/handback.sh. The
// broadcast payloads and the synchronized draws are checked, not only timed. Exits 1, naming the
// rank, the operation and the status, when anything fails, and when the machine has fewer than
// two GPUs (it then cannot measure).
//
//   rng_nccl_benchmark [--iterations=2000] [--warmup=200]

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "base/cuda_boundary.h"
#include "base/status_macros.h"
#include "base/tool_flags.h"
#include "c10/cuda/CUDAGuard.h"
#include "collectives/nccl_communicator.h"
#include "collectives/rendezvous.h"
#include "rng/rank_streams.h"
#include "rng/synchronize.h"
#include "testing/nccl_world.h"

ABSL_FLAG(int, iterations, 2000, "timed iterations (at least 10)");
ABSL_FLAG(int, warmup, 200, "iterations run before timing (CUDA contexts, NCCL, first touch)");

namespace lockstep {
namespace rng {
namespace {

using collectives::NcclCommunicator;

double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

absl::Status Nccl(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": NCCL ", ncclGetErrorString(r)));
}

// Plain NCCL, as a user without lockstep would move the bytes: a blocking communicator, its own
// stream, a pinned host buffer and a device buffer.
struct PlainNccl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* pinned = nullptr;
  void* device = nullptr;
  ~PlainNccl() {
    if (comm != nullptr) ncclCommDestroy(comm);
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (pinned != nullptr) cudaFreeHost(pinned);
    if (device != nullptr) cudaFree(device);
  }
};

absl::Status SetUpPlain(NcclCommunicator& world, int rank, size_t bytes, PlainNccl& plain) {
  ncclUniqueId id;
  if (rank == 0) {
    if (absl::Status s = Nccl(ncclGetUniqueId(&id), "ncclGetUniqueId"); !s.ok()) return s;
  }
  std::string wire(reinterpret_cast<const char*>(&id), sizeof(id));
  if (absl::Status s = collectives::BroadcastBytes(world, &wire, 0); !s.ok()) return s;
  std::memcpy(&id, wire.data(), sizeof(id));
  if (absl::Status s =
          Nccl(ncclCommInitRank(&plain.comm, world.size(), id, rank), "ncclCommInitRank (plain)");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CudaStatus(cudaStreamCreateWithFlags(&plain.stream, cudaStreamNonBlocking),
                                  "cudaStreamCreate");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CudaStatus(cudaMallocHost(&plain.pinned, bytes), "cudaMallocHost");
      !s.ok()) {
    return s;
  }
  return CudaStatus(cudaMalloc(&plain.device, bytes), "cudaMalloc");
}

// A second lockstep world over the same processes with other options; its store is named by
// rank 0 of `world`.
absl::StatusOr<std::unique_ptr<NcclCommunicator>> SecondWorld(NcclCommunicator& world, int rank,
                                                              const std::string& name,
                                                              NcclCommunicator::Options options) {
  std::string store = absl::StrCat("/tmp/rng_nccl_benchmark_", name, "_", getpid());
  LOCKSTEP_RETURN_IF_ERROR(collectives::BroadcastBytes(world, &store, 0));
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::shared_ptr<collectives::Rendezvous> rendezvous,
      collectives::Rendezvous::File(store, rank, world.size(), absl::Seconds(60)));
  options.device = rank;
  return NcclCommunicator::Create(rendezvous, options);
}

absl::Status RunRank(int rank, NcclCommunicator& lane) {
  const int iterations = absl::GetFlag(FLAGS_iterations);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(rank));
  absl::StatusOr<std::shared_ptr<RankStreams>> created =
      RankStreams::Create(DefaultGenerators::WithCudaDevice(rank));
  if (!created.ok()) return created.status();
  RankStreams& streams = **created;
  if (!lane.uses_host_lane()) {
    return absl::FailedPreconditionError(
        "the default world did not set up its host lane, though all its GPUs share this host");
  }
  // Worlds whose CPU tensors cross the GPUs through NCCL, for comparison.
  NcclCommunicator::Options nccl_options;
  nccl_options.host_lane = false;
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> mapped,
                            SecondWorld(lane, rank, "mapped", nccl_options));
  nccl_options.cpu_staging = NcclCommunicator::CpuStaging::kDeviceCopies;
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> copies,
                            SecondWorld(lane, rank, "copies", nccl_options));
  const size_t bytes = SynchronizeWireBytes(streams.generators());
  PlainNccl plain;
  if (absl::Status s = SetUpPlain(lane, rank, bytes, plain); !s.ok()) return s;
  std::vector<uint8_t> source(bytes);
  for (size_t i = 0; i < bytes; ++i) source[i] = static_cast<uint8_t>(i * 13 + 5);
  at::Tensor payload = at::empty({static_cast<int64_t>(bytes)}, at::kByte);
  const at::Tensor expected =
      at::from_blob(source.data(), {static_cast<int64_t>(bytes)}, at::kByte);
  at::manual_seed(100 + rank);

  using Op = std::function<absl::Status()>;
  auto bare = [&](collectives::Communicator& comm) -> absl::Status {
    if (comm.rank() == 0) {
      std::memcpy(payload.data_ptr(), source.data(), bytes);
    } else {
      payload.fill_(0);
    }
    if (absl::Status s = comm.Broadcast(payload, 0); !s.ok()) return s;
    if (!at::equal(payload, expected)) {
      return absl::DataLossError("the broadcast delivered other bytes than the root's");
    }
    return absl::OkStatus();
  };
  auto scope = [&]() -> absl::Status {
    absl::StatusOr<ModelStreamScope> entered = ModelStreamScope::Enter(streams);
    if (!entered.ok()) return entered.status();
    return entered->Exit();
  };
  std::vector<std::pair<std::string, Op>> ops = {
      {"floor_device",
       [&]() -> absl::Status {
         if (absl::Status s = Nccl(ncclBroadcast(plain.device, plain.device, bytes, ncclUint8, 0,
                                                 plain.comm, plain.stream),
                                   "ncclBroadcast");
             !s.ok()) {
           return s;
         }
         return CudaStatus(cudaStreamSynchronize(plain.stream), "cudaStreamSynchronize");
       }},
      {"floor_staged",
       [&]() -> absl::Status {
         if (rank == 0) std::memcpy(plain.pinned, source.data(), bytes);
         if (absl::Status s = CudaStatus(cudaMemcpyAsync(plain.device, plain.pinned, bytes,
                                                         cudaMemcpyHostToDevice, plain.stream),
                                         "upload");
             !s.ok()) {
           return s;
         }
         if (absl::Status s = Nccl(ncclBroadcast(plain.device, plain.device, bytes, ncclUint8, 0,
                                                 plain.comm, plain.stream),
                                   "ncclBroadcast");
             !s.ok()) {
           return s;
         }
         if (absl::Status s = CudaStatus(cudaMemcpyAsync(plain.pinned, plain.device, bytes,
                                                         cudaMemcpyDeviceToHost, plain.stream),
                                         "download");
             !s.ok()) {
           return s;
         }
         if (absl::Status s = CudaStatus(cudaStreamSynchronize(plain.stream), "sync"); !s.ok())
           return s;
         if (std::memcmp(plain.pinned, source.data(), bytes) != 0) {
           return absl::DataLossError("plain NCCL delivered other bytes than the root's");
         }
         return absl::OkStatus();
       }},
      {"bare_lane", [&] { return bare(lane); }},
      {"bare_mapped", [&] { return bare(*mapped); }},
      {"bare_copies", [&] { return bare(*copies); }},
      {"synchronize", [&] { return Synchronize(&lane, streams); }},
      {"scope", scope},
      {"handback",
       [&]() -> absl::Status {
         if (absl::Status s = scope(); !s.ok()) return s;
         return Synchronize(&lane, streams);
       }},
      {"handback_nccl",
       [&]() -> absl::Status {
         if (absl::Status s = scope(); !s.ok()) return s;
         return Synchronize(mapped.get(), streams);
       }},
  };
  std::map<std::string, std::vector<double>> times;
  for (int i = 0; i < warmup + iterations; ++i) {
    for (auto& [name, op] : ops) {
      const auto start = std::chrono::steady_clock::now();
      const absl::Status status = op();
      const auto end = std::chrono::steady_clock::now();
      if (!status.ok()) {
        return Annotate(status, absl::StrCat("in ", name, ", iteration ", i));
      }
      if (i >= warmup) {
        times[name].push_back(std::chrono::duration<double, std::micro>(end - start).count());
      }
    }
  }
  // The synchronized streams agree: every GPU draws the same CPU and CUDA numbers.
  if (absl::Status s = Synchronize(&lane, streams); !s.ok()) return s;
  at::Tensor draws =
      at::cat({at::rand({8}), at::rand({8}, at::TensorOptions().device(at::kCUDA, rank)).cpu()});
  absl::StatusOr<std::vector<at::Tensor>> all = mapped->AllGather(draws);
  if (!all.ok()) return all.status();
  for (const at::Tensor& other : *all) {
    if (!at::equal(other, draws)) {
      return absl::InternalError("after Synchronize the GPUs draw different numbers");
    }
  }
  if (rank == 0) {
    std::map<std::string, double> median;
    for (const auto& [name, samples] : times) median[name] = Median(samples);
    std::printf(
        "NCCL world of %d GPUs (one process each), %zu-byte Synchronize wire, "
        "%d iterations after %d warm-up, medians of a paired loop:\n",
        lane.size(), bytes, iterations, warmup);
    for (const auto& [name, _] : ops) std::printf("  %-14s %8.1f us\n", name.c_str(), median[name]);
    const double handback = median["handback"];
    std::printf("handback (scope + Synchronize): %.1f us (target <= 20 us: %s)\n", handback,
                handback <= 20.0 ? "met" : "NOT met");
    std::printf("handback_nccl (host lane off): %.1f us (target <= 20 us: %s)\n",
                median["handback_nccl"], median["handback_nccl"] <= 20.0 ? "met" : "NOT met");
    std::printf("ratio handback / plain-NCCL staged floor: %.3f\n",
                handback / median["floor_staged"]);
    std::printf("ratio handback / plain-NCCL device floor: %.3f\n",
                handback / median["floor_device"]);
    std::printf("ratio bare_lane / plain-NCCL staged floor: %.3f\n",
                median["bare_lane"] / median["floor_staged"]);
    std::printf("ratio bare_mapped / plain-NCCL staged floor: %.3f\n",
                median["bare_mapped"] / median["floor_staged"]);
    std::printf("ratio bare_copies / plain-NCCL staged floor: %.3f\n",
                median["bare_copies"] / median["floor_staged"]);
    std::printf("HANDBACK_US=%.2f\n", handback);
    std::printf("HANDBACK_NCCL_US=%.2f\n", median["handback_nccl"]);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace rng
}  // namespace lockstep

int main(int argc, char** argv) {
  const std::vector<std::string> args = lockstep::ParseToolFlags(
      argc, argv, "rng_nccl_benchmark [--iterations=N] [--warmup=N]: one process per GPU");
  if (absl::Status s = lockstep::NoPositionalArguments(args); !s.ok()) {
    std::fprintf(stderr, "rng_nccl_benchmark: %s\n", std::string(s.message()).c_str());
    return lockstep::kBadInputExitCode;
  }
  if (absl::GetFlag(FLAGS_iterations) < 10) {
    std::fprintf(stderr,
                 "rng_nccl_benchmark: --iterations=%d is under 10, the fewest a median is "
                 "reported from\n",
                 absl::GetFlag(FLAGS_iterations));
    return lockstep::kBadInputExitCode;
  }
  if (absl::GetFlag(FLAGS_warmup) < 1) {
    std::fprintf(stderr, "rng_nccl_benchmark: --warmup=%d must be at least 1\n",
                 absl::GetFlag(FLAGS_warmup));
    return lockstep::kBadInputExitCode;
  }
  lockstep::collectives::NcclWorldOptions options;
  options.timeout = absl::Seconds(60);
  options.deadline = absl::Seconds(600);
  lockstep::collectives::NcclWorldResult result = lockstep::collectives::RunNcclWorld(
      options, [](int rank, lockstep::collectives::NcclCommunicator& world) {
        return lockstep::rng::RunRank(rank, world);
      });
  if (!result.skip_reason.empty()) {
    std::fprintf(stderr, "rng_nccl_benchmark: cannot measure: %s\n", result.skip_reason.c_str());
    return 1;
  }
  int failed = 0;
  for (size_t r = 0; r < result.ranks.size(); ++r) {
    if (result.ranks[r].ok()) continue;
    std::fprintf(stderr, "rng_nccl_benchmark: rank %zu: %s\n", r,
                 result.ranks[r].ToString().c_str());
    ++failed;
  }
  return failed == 0 ? 0 : 1;
}
