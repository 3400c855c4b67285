#include "testing/nccl_world.h"

#include "base/temp_dir.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/subprocess.h"
#include "collectives/rendezvous.h"
#include "testing/process_world.h"

namespace lockstep {
namespace collectives {

absl::StatusOr<int> CountGpusInChild() {
  absl::StatusOr<Child> counter = Child::Fork(ChildOptions::Reporting(), [](int channel) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    return write(channel, &count, sizeof(count)) == static_cast<ssize_t>(sizeof(count)) ? 0 : 1;
  });
  if (!counter.ok()) return counter.status();
  std::string report;
  Child* child = &*counter;
  for (;;) {
    absl::StatusOr<int> open =
        PollChannels({child}, absl::Seconds(60),
                     [&](size_t, absl::string_view b) { report.append(b.data(), b.size()); });
    if (!open.ok()) return open.status();
    if (*open == 0) break;
  }
  counter->Reap();
  int count = 0;
  if (report.size() != sizeof(count)) {
    return absl::InternalError(
        absl::StrCat("counting GPUs: the child ", counter->Describe(), " without reporting"));
  }
  std::memcpy(&count, report.data(), sizeof(count));
  return count;
}

NcclWorldResult RunNcclWorld(const NcclWorldOptions& options,
                             std::function<absl::Status(int rank, NcclCommunicator& world)> body) {
  NcclWorldResult result;
  absl::StatusOr<int> gpus = CountGpusInChild();
  if (!gpus.ok()) {
    result.ranks = {gpus.status()};
    return result;
  }
  if (*gpus < 2) {
    result.skip_reason =
        absl::StrCat("NCCL across GPUs needs at least 2 GPUs; this machine has ", *gpus);
    return result;
  }
  std::string store = absl::StrCat(TempDir::Root(), "/nccl_world.XXXXXX");
  if (mkdtemp(store.data()) == nullptr) {
    result.ranks = {
        absl::InternalError(absl::StrCat("mkdtemp ", store, ": ", std::strerror(errno)))};
    return result;
  }
  store += "/store";
  ProcessWorldOptions world;
  world.world_size = *gpus;
  world.collective_timeout = options.timeout;
  world.deadline = options.deadline;
  result.ranks = RunProcessWorld(world, [&](int rank, Communicator&) -> absl::Status {
    absl::StatusOr<std::shared_ptr<Rendezvous>> rendezvous =
        Rendezvous::File(store, rank, *gpus, options.timeout);
    if (!rendezvous.ok()) return rendezvous.status();
    NcclCommunicator::Options nccl;
    nccl.device = rank;
    nccl.timeout = options.timeout;
    nccl.cpu_staging = options.cpu_staging;
    nccl.host_lane = options.host_lane;
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm =
        NcclCommunicator::Create(*rendezvous, nccl);
    if (!comm.ok()) return comm.status();
    return body(rank, **comm);
  });
  std::remove(store.c_str());
  return result;
}

}  // namespace collectives
}  // namespace lockstep
