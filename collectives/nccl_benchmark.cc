// gpu: latency of a small broadcast through lockstep's NcclCommunicator (the NCCL API, polled
// to completion) against c10d's ProcessGroupNCCL (work->wait() plus a stream synchronize, so
// both measure until the host knows the result is on the device), same process, same GPU, same
// payloads (16 B to 64 KiB). A world of one on a one-GPU machine: it measures the call path,
// which is what dominates the small RNG-state broadcasts lockstep makes. Also: CPU tensors
// through the communicator's staging against staging them by hand with pageable copies. Figures
// for context (no targets; rng_nccl_benchmark carries the across-GPU target); every loop runs
// after 20 warm-up calls.

#include <unistd.h>

#include <memory>
#include <string>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "c10/cuda/CUDAStream.h"
#include "collectives/nccl_communicator.h"
#include "collectives/rendezvous.h"
#include "cuda_runtime_api.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp"

namespace lockstep {
namespace collectives {
namespace {

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t bytes : {16, 256, 4096, 65536}) b->Arg(bytes);
  b->ArgName("bytes")->Unit(benchmark::kMicrosecond)->UseRealTime();
}

NcclCommunicator* WorldOfOne() {
  static NcclCommunicator* comm = [] {
    auto rendezvous = Rendezvous::File(absl::StrCat("/tmp/lockstep_nccl_bench_", getpid()), 0, 1,
                                       absl::Seconds(30));
    if (!rendezvous.ok()) return static_cast<NcclCommunicator*>(nullptr);
    auto created = NcclCommunicator::Create(*rendezvous, NcclCommunicator::Options());
    if (!created.ok()) return static_cast<NcclCommunicator*>(nullptr);
    return created->release();
  }();
  return comm;
}

enum class Payload {
  kDevice,       // a CUDA tensor: no copies
  kCpuStaged,    // a CPU tensor through the communicator's pinned staging (one wait)
  kCpuPageable,  // a CPU tensor staged by hand the plain way: pageable copy there and back
};

void BM_LockstepNcclBroadcast(benchmark::State& state, Payload kind) {
  NcclCommunicator* comm = WorldOfOne();
  if (comm == nullptr) {
    state.SkipWithError("NcclCommunicator::Create failed");
    return;
  }
  at::Tensor payload = at::zeros(
      {state.range(0)}, at::TensorOptions().dtype(at::kByte).device(
                            kind == Payload::kDevice ? at::Device(at::kCUDA, 0) : at::kCPU));
  auto once = [&]() -> absl::Status {
    at::Tensor moved =
        kind == Payload::kCpuPageable ? payload.to(at::Device(at::kCUDA, 0)) : payload;
    absl::Status status = comm->Broadcast(moved, 0);
    if (status.ok() && kind == Payload::kCpuPageable) payload.copy_(moved);
    return status;
  };
  for (int warm = 0; warm < 20; ++warm) {  // staging buffers, kernels: outside the timing
    if (absl::Status s = once(); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
  }
  for (auto _ : state) {
    if (absl::Status s = once(); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
  }
}

void StateSizes(benchmark::internal::Benchmark* b) {
  for (int64_t bytes : {16, 5073, 65536}) b->Arg(bytes);  // 5073: Synchronize's wire with CUDA
  b->ArgName("bytes")->Unit(benchmark::kMicrosecond)->UseRealTime();
}

void BM_C10dNcclBroadcast(benchmark::State& state) {
  static c10::intrusive_ptr<c10d::ProcessGroupNCCL>* pg = [] {
    auto store = c10::make_intrusive<c10d::FileStore>(
        absl::StrCat("/tmp/lockstep_c10d_bench_", getpid()), 1);
    return new c10::intrusive_ptr<c10d::ProcessGroupNCCL>(
        c10::make_intrusive<c10d::ProcessGroupNCCL>(store, 0, 1));
  }();
  at::Tensor payload =
      at::zeros({state.range(0)}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
  std::vector<at::Tensor> tensors = {payload};
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(0).stream();
  for (int warm = 0; warm < 20; ++warm) {  // communicator setup happens on the first call
    (*pg)->broadcast(tensors)->wait();
    cudaStreamSynchronize(stream);
  }
  for (auto _ : state) {
    (*pg)->broadcast(tensors)->wait();
    cudaStreamSynchronize(stream);
  }
}

BENCHMARK_CAPTURE(BM_LockstepNcclBroadcast, device_tensor, Payload::kDevice)->Apply(Sizes);
BENCHMARK(BM_C10dNcclBroadcast)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_LockstepNcclBroadcast, cpu_mapped_staging, Payload::kCpuStaged)
    ->Apply(StateSizes);
BENCHMARK_CAPTURE(BM_LockstepNcclBroadcast, cpu_pageable_by_hand, Payload::kCpuPageable)
    ->Apply(StateSizes);

}  // namespace
}  // namespace collectives
}  // namespace lockstep

BENCHMARK_MAIN();
