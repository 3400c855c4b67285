// Throughput of numerics' evidence tools: the state digest, the tensor comparison, an
// inventory of a 1 GiB state and one of a state at a large model's scale, on the CPU and, in CUDA
// builds, on the GPU, beside a plain copy of the same bytes in the same run. Bytes per second
// count the input bytes read: one tensor for a digest, both for a comparison. Every benchmark runs
// its operation once before timing (first-touch memory, CUDA context, kernel load). After the runs
// a CUDA build prints each device figure against its target (>= 2.5 TB/s for the digest and the
// comparison of one 1 GiB tensor, and for the inventory of the 20,306-tensor state) and as a share
// of what the copy read. A CUDA build without a GPU exits 1: it cannot measure what it is for.

#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "base/ratio_reporter.h"
#include "benchmark/benchmark.h"
#include "numerics/compare.h"
#include "numerics/digest.h"
#include "numerics/inventory.h"
#if LOCKSTEP_BUILT_WITH_CUDA
#include "ATen/cuda/CUDAContext.h"
#endif

namespace lockstep {
namespace numerics {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

at::Tensor Floats(int64_t bytes, at::Device device) {
  return at::randn({bytes / 4}, at::TensorOptions().device(device));
}

void Synchronize(at::Device device) {
#if LOCKSTEP_BUILT_WITH_CUDA
  if (device.is_cuda()) at::cuda::getCurrentCUDAStream().synchronize();
#else
  (void)device;
#endif
}

void BM_Digest(benchmark::State& state, at::Device device) {
  const int64_t bytes = state.range(0) * kMiB;
  const at::Tensor t = Floats(bytes, device);
  if (!DigestTensor(t).ok()) state.SkipWithError("the digest failed");
  for (auto _ : state) benchmark::DoNotOptimize(DigestTensor(t));
  state.SetBytesProcessed(state.iterations() * bytes);
}

void BM_Compare(benchmark::State& state, at::Device device) {
  const int64_t bytes = state.range(0) * kMiB;
  const at::Tensor b = Floats(bytes, device);
  const at::Tensor a = b + 1e-4 * at::randn_like(b);
  Synchronize(device);
  if (!CompareTensors(a, b, Tolerance()).ok()) state.SkipWithError("the comparison failed");
  for (auto _ : state) benchmark::DoNotOptimize(CompareTensors(a, b, Tolerance()));
  state.SetBytesProcessed(state.iterations() * 2 * bytes);
}

// A 1 GiB state of 8 tensors of 128 MiB, inventoried end to end (digests and state digest).
void BM_Inventory1GiB(benchmark::State& state, at::Device device) {
  NamedTensors tensors;
  for (int i = 0; i < 8; ++i)
    tensors.emplace_back("layer" + std::to_string(i), Floats(128 * kMiB, device));
  Synchronize(device);
  if (!Inventory::Of(tensors).ok()) state.SkipWithError("the inventory failed");
  for (auto _ : state) benchmark::DoNotOptimize(Inventory::Of(tensors));
  state.SetBytesProcessed(state.iterations() * 1024 * kMiB);
}

// A state at a large model's scale (Note [Batched digests] in digest.cc), bf16, inventoried end
// to end. On the GPU, a 30B-class mixture of experts: 48 layers of 416 expert matrices
// [800, 2048], four attention projections, a router and two norms, plus the embedding and the
// output layer: 20,306 tensors, ~64 GiB (target: inventoried at >= 2.5 TB/s on the H200). On the
// CPU, 2,000 tensors of [512, 1024]: 2 GiB.
std::vector<std::pair<std::string, std::vector<int64_t>>> StateShapes(bool gpu) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    shapes.emplace_back(std::move(name), std::move(shape));
  };
  if (!gpu) {
    for (int i = 0; i < 2000; ++i) add("expert" + std::to_string(i), {512, 1024});
    return shapes;
  }
  add("embed", {151936, 2048});
  add("lm_head", {151936, 2048});
  for (int layer = 0; layer < 48; ++layer) {
    const std::string l = "layers." + std::to_string(layer) + ".";
    for (int e = 0; e < 416; ++e) add(l + "experts." + std::to_string(e), {800, 2048});
    add(l + "q", {4096, 2048});
    add(l + "k", {512, 2048});
    add(l + "v", {512, 2048});
    add(l + "o", {2048, 4096});
    add(l + "router", {128, 2048});
    add(l + "norm1", {2048});
    add(l + "norm2", {2048});
  }
  return shapes;
}

// The state's bytes (bf16).
int64_t StateBytes(bool gpu) {
  int64_t bytes = 0;
  for (const auto& [name, shape] : StateShapes(gpu)) {
    int64_t n = 2;
    for (int64_t d : shape) n *= d;
    bytes += n;
  }
  return bytes;
}

NamedTensors StateAtScale(at::Device device, int64_t* bytes) {
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16).device(device);
  NamedTensors tensors;
  for (auto& [name, shape] : StateShapes(device.is_cuda())) {
    tensors.emplace_back(std::move(name), at::randn(shape, bf16));
  }
  *bytes = StateBytes(device.is_cuda());
  return tensors;
}

void BM_InventoryAtScale(benchmark::State& state, at::Device device) {
  int64_t bytes = 0;
  const NamedTensors tensors = StateAtScale(device, &bytes);
  Synchronize(device);
  if (!Inventory::Of(tensors).ok()) state.SkipWithError("the inventory failed");
  for (auto _ : state) benchmark::DoNotOptimize(Inventory::Of(tensors));
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["tensors"] = static_cast<double>(tensors.size());
  state.counters["GiB"] = static_cast<double>(bytes) / (1024.0 * kMiB);
}

// The baseline of the same run: the same state's tensors digested one by one (DigestTensor).
void BM_OneByOneAtScale(benchmark::State& state, at::Device device) {
  int64_t bytes = 0;
  const NamedTensors tensors = StateAtScale(device, &bytes);
  Synchronize(device);
  for (const auto& named : tensors) {
    if (!DigestTensor(named.second).ok()) state.SkipWithError("a digest failed");
  }
  for (auto _ : state) {
    for (const auto& named : tensors) benchmark::DoNotOptimize(DigestTensor(named.second));
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

// Bytes read by a read-only pass over arg MiB (a sum into one preallocated element: every byte
// read once, nothing but the scalar written): the memory's read rate in the same run, the
// ceiling of the digest and the comparison, which only read too.
void BM_ReadOnly(benchmark::State& state, at::Device device) {
  const int64_t bytes = state.range(0) * kMiB;
  const at::Tensor source = Floats(bytes, device);
  at::Tensor sum = at::empty({}, source.options());
  at::sum_out(sum, source);
  Synchronize(device);
  for (auto _ : state) {
    at::sum_out(sum, source);
    Synchronize(device);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

// Bytes read by a device-to-device copy of arg MiB (it writes as many): a plain stream's rate,
// shown beside the read-only ceiling for comparison with earlier figures.
void BM_Copy(benchmark::State& state, at::Device device) {
  const int64_t bytes = state.range(0) * kMiB;
  const at::Tensor source = Floats(bytes, device);
  at::Tensor target = at::empty_like(source);
  target.copy_(source);
  Synchronize(device);
  for (auto _ : state) {
    target.copy_(source);
    Synchronize(device);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

BENCHMARK_CAPTURE(BM_Digest, cpu, at::Device(at::kCPU))
    ->Arg(256)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Compare, cpu, at::Device(at::kCPU))
    ->Arg(64)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Inventory1GiB, cpu, at::Device(at::kCPU))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_InventoryAtScale, cpu, at::Device(at::kCPU))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_OneByOneAtScale, cpu, at::Device(at::kCPU))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_ReadOnly, cpu, at::Device(at::kCPU))
    ->Arg(256)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Copy, cpu, at::Device(at::kCPU))
    ->Arg(256)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
#if LOCKSTEP_BUILT_WITH_CUDA
// Note [What bounds the kernels]: BM_ReadOnly is what the memory gives a read-only pass over the
// same 1 GiB in the same run, the ceiling the digest and comparison (which only read) are
// measured against; BM_Copy, a read and a write, is shown beside it. 16 MiB
// stays in the H200's L2 cache between iterations, so its time is the call's fixed cost (launch,
// the result's copy back to the host) plus the kernel's own work without the memory's: what is
// left to amortize when a state has many small tensors.
BENCHMARK_CAPTURE(BM_ReadOnly, cuda, at::Device(at::kCUDA, 0))
    ->Arg(1024)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Copy, cuda, at::Device(at::kCUDA, 0))
    ->Arg(1024)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Digest, cuda, at::Device(at::kCUDA, 0))
    ->Arg(1024)
    ->Arg(16)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Compare, cuda, at::Device(at::kCUDA, 0))
    ->Arg(1024)
    ->Arg(16)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Inventory1GiB, cuda, at::Device(at::kCUDA, 0))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(20);
BENCHMARK_CAPTURE(BM_InventoryAtScale, cuda, at::Device(at::kCUDA, 0))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(5);
BENCHMARK_CAPTURE(BM_OneByOneAtScale, cuda, at::Device(at::kCUDA, 0))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
#endif

#if LOCKSTEP_BUILT_WITH_CUDA
constexpr double kDeviceTarget = 2.5e12;  // bytes of input per second

// "<what>: X TB/s (target >= 2.5 TB/s: met|NOT met; Y of a read-only pass over the same bytes,
// Z of a copy's)" from the run's bytes per second; a run that did not measure is said and
// counted.
bool PrintThroughput(const benchmarking::RatioReporter& reporter, const std::string& what,
                     const std::string& run, double bytes, double read_rate, double copy_rate) {
  // The reporter keeps each run's time in its unit: milliseconds here.
  std::optional<double> seconds = reporter.Seconds(run);
  if (seconds.has_value()) *seconds *= 1e-3;
  if (!seconds.has_value() || *seconds <= 0) {
    std::fprintf(stderr, "numerics_benchmark: %s: %s did not measure\n", what.c_str(), run.c_str());
    return false;
  }
  const double rate = bytes / *seconds;
  std::printf(
      "%s: %.2f TB/s (target >= %.1f TB/s: %s; %.2f of a read-only pass over the same bytes, %.2f "
      "of a copy's read rate)\n",
      what.c_str(), 1e-12 * rate, 1e-12 * kDeviceTarget, rate >= kDeviceTarget ? "met" : "NOT met",
      read_rate > 0 ? rate / read_rate : 0.0, copy_rate > 0 ? rate / copy_rate : 0.0);
  return true;
}

// A run's rate over `bytes`, or 0 when it did not measure.
double RateOf(const benchmarking::RatioReporter& reporter, const std::string& run, double bytes) {
  const std::optional<double> ms = reporter.Seconds(run);
  return ms.has_value() && *ms > 0 ? bytes / (1e-3 * *ms) : 0.0;
}

bool PrintTargets(const benchmarking::RatioReporter& reporter) {
  const double gib = 1024.0 * kMiB;
  const double read_rate = RateOf(reporter, "BM_ReadOnly/cuda/1024/real_time", gib);
  const double copy_rate = RateOf(reporter, "BM_Copy/cuda/1024/real_time", gib);
  if (read_rate <= 0) {
    std::fprintf(stderr, "numerics_benchmark: the read-only pass did not measure\n");
    return false;
  }
  std::printf("read-only pass over 1 GiB: %.2f TB/s; a copy: %.2f TB/s read\n", 1e-12 * read_rate,
              1e-12 * copy_rate);
  bool measured = true;
  measured &= PrintThroughput(reporter, "digest of one 1 GiB tensor",
                              "BM_Digest/cuda/1024/real_time", gib, read_rate, copy_rate);
  measured &= PrintThroughput(reporter, "comparison of two 1 GiB tensors (input read)",
                              "BM_Compare/cuda/1024/real_time", 2 * gib, read_rate, copy_rate);
  measured &=
      PrintThroughput(reporter, "inventory of a 1 GiB state",
                      "BM_Inventory1GiB/cuda/iterations:20/real_time", gib, read_rate, copy_rate);
  measured &= PrintThroughput(reporter, "inventory of the 20,306-tensor state",
                              "BM_InventoryAtScale/cuda/iterations:5/real_time",
                              static_cast<double>(StateBytes(/*gpu=*/true)), read_rate, copy_rate);
  return measured;
}
#endif

}  // namespace
}  // namespace numerics
}  // namespace lockstep

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
#if LOCKSTEP_BUILT_WITH_CUDA
  if (!at::cuda::is_available()) {
    std::fprintf(stderr,
                 "numerics_benchmark: built with CUDA but no GPU is visible; the device "
                 "benchmarks cannot measure\n");
    return 1;
  }
#endif
  lockstep::benchmarking::RatioReporter reporter;  // counts runs that could not measure
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  bool measured = reporter.all_measured();
#if LOCKSTEP_BUILT_WITH_CUDA
  measured &= lockstep::numerics::PrintTargets(reporter);
#endif
  return measured ? 0 : 1;
}
