#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <string>

#include "numerics/internal/device_context.h"

namespace lockstep {
namespace numerics {
namespace internal {
namespace {

std::string Uuid(const cudaUUID_t& uuid) {
  std::string text = "GPU-";
  char part[3];
  for (int i = 0; i < 16; ++i) {
    std::snprintf(part, sizeof part, "%02x", static_cast<unsigned char>(uuid.bytes[i]));
    text += part;
    if (i == 3 || i == 5 || i == 7 || i == 9) text += '-';
  }
  return text;
}

}  // namespace

nlohmann::json DeviceContext() {
  nlohmann::json cuda = {{"built_with_cuda", true}};
  int runtime = 0, driver = 0, nccl = 0;
  cuda["runtime_version"] = cudaRuntimeGetVersion(&runtime) == cudaSuccess ? runtime : -1;
  cuda["driver_version"] = cudaDriverGetVersion(&driver) == cudaSuccess ? driver : -1;
  cuda["nccl_version"] = ncclGetVersion(&nccl) == ncclSuccess ? nccl : -1;
  int major = 0, minor = 0, patch = 0;
  const bool cublas = cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
                      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
                      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS;
  cuda["cublas_version"] =
      cublas ? std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch)
             : "unknown";
  nlohmann::json devices = nlohmann::json::array();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp props;
    if (cudaGetDeviceProperties(&props, d) != cudaSuccess) continue;
    devices.push_back(
        {{"index", d},
         {"name", props.name},
         {"uuid", Uuid(props.uuid)},
         {"compute_capability", std::to_string(props.major) + "." + std::to_string(props.minor)}});
  }
  cuda["devices"] = devices;
  return cuda;
}

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep
