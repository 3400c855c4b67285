#include "base/nccl_settings.h"

#include <cstdlib>
#include <mutex>

namespace lockstep {
namespace {

std::mutex& Mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}

std::vector<NcclSettings>& Seen() {
  static auto* seen = new std::vector<NcclSettings>;
  return *seen;
}

std::string Get(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

}  // namespace

void RecordNcclCommunicatorSettings() {
  const NcclSettings now{Get("NCCL_ALGO"), Get("NCCL_PROTO")};
  std::lock_guard<std::mutex> lock(Mutex());
  for (const NcclSettings& s : Seen()) {
    if (s.algo == now.algo && s.proto == now.proto) return;
  }
  Seen().push_back(now);
}

std::vector<NcclSettings> NcclCommunicatorSettings() {
  std::lock_guard<std::mutex> lock(Mutex());
  return Seen();
}

}  // namespace lockstep
