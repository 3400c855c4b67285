// gpu build only (no device needed): every mapping of base/cuda_boundary.h, and a real
// allocation failure from the runtime classified as out of memory.

#include "base/cuda_boundary.h"

#include <cuda_runtime_api.h>

#include <cstddef>

#include "gtest/gtest.h"

namespace lockstep {
namespace {

TEST(CudaStatusTest, SuccessIsOk) { EXPECT_TRUE(CudaStatus(cudaSuccess, "anything").ok()); }

TEST(CudaStatusTest, OutOfMemoryIsResourceExhausted) {
  const absl::Status s = CudaStatus(cudaErrorMemoryAllocation, "allocating staging memory");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message().find("allocating staging memory: CUDA cudaErrorMemoryAllocation: "), 0u)
      << s;
}

TEST(CudaStatusTest, BadInputIsInvalidArgument) {
  EXPECT_EQ(CudaStatus(cudaErrorInvalidValue, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaStatus(cudaErrorInvalidDevice, "x").code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaStatusTest, OtherErrorsAreInternal) {
  EXPECT_EQ(CudaStatus(cudaErrorLaunchFailure, "x").code(), absl::StatusCode::kInternal);
  EXPECT_EQ(CudaStatus(cudaErrorIllegalAddress, "x").code(), absl::StatusCode::kInternal);
}

TEST(CudaStatusTest, RuntimeAllocationFailureIsResourceExhausted) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "no CUDA device: the runtime cannot be asked to allocate";
  }
  void* pointer = nullptr;
  // More than any device has: the runtime itself reports cudaErrorMemoryAllocation.
  const absl::Status s = CudaStatus(cudaMalloc(&pointer, size_t{1} << 50), "a 1 PiB cudaMalloc");
  cudaGetLastError();  // clear the sticky-free error state for later tests
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

}  // namespace
}  // namespace lockstep
