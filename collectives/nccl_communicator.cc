#include "collectives/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/cuda_boundary.h"
#include "base/nccl_settings.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"
#include "collectives/internal/host_lane.h"
#include "collectives/internal/nccl_calls.h"
#include "collectives/internal/nccl_staging.h"

namespace lockstep {
namespace collectives {

using internal::Abort;
using internal::Await;
using internal::CheckTensor;
using internal::CreateComm;
using internal::Enqueue;
using internal::ExchangeUniqueId;
using internal::InitComm;
using internal::NcclError;
using internal::NcclType;

namespace internal {

struct NcclTransport {
  std::shared_ptr<Rendezvous> rendezvous;
  int device = 0;
  NcclCommunicator::CpuStaging cpu_staging = NcclCommunicator::CpuStaging::kMappedHost;
  bool host_lane = true;
};

struct NcclGroup {
  // The group's NCCL communicator, its fast lane and (with NcclTransport::host_lane) its host
  // lane (Note [Transport and group]).
  static absl::StatusOr<std::unique_ptr<NcclGroup>> Create(const NcclTransport& transport,
                                                           const WorldState& world,
                                                           const GroupIdentity& identity,
                                                           absl::Duration timeout);
  NcclGroup(NcclCommunicator::CpuStaging mode, int device) : staging(mode, device) {}
  ~NcclGroup() {
    // Abort rather than destroy: destroy waits for outstanding work, which could be a hang.
    if (comm != nullptr) ncclCommAbort(comm);
    if (fast != nullptr) ncclCommAbort(fast);
    if (fast_stream != nullptr) cudaStreamDestroy(fast_stream);
  }

  ncclComm_t comm = nullptr;      // non-blocking; null once aborted
  internal::NcclStaging staging;  // Note [CPU staging]
  // The fast lane (Note [Fast lane]): a blocking communicator over the same members, on a
  // stream of its own, for small CPU tensors. Null when it could not be set up.
  ncclComm_t fast = nullptr;
  cudaStream_t fast_stream = nullptr;
  // The host lane (Note [Host lane]); null when off or when a member is on another host.
  std::unique_ptr<internal::HostLane> host_lane;
};

}  // namespace internal

namespace {

// Note [Fast lane]
// A non-blocking NCCL communicator launches every collective from a new thread and returns
// ncclInProgress (seen in NCCL's group launch), which costs a small CPU-tensor broadcast more
// than twice what a plain staged NCCL broadcast takes (nccl_benchmark). lockstep needs the
// non-blocking form so that creation and collectives can be bounded and aborted, but its
// hand-back traffic is small CPU tensors. So each communicator also sets up a blocking
// communicator over the same members, its fast lane, and warms it up with every collective it
// will carry at the sizes it will carry (so NCCL's lazily established connections exist before
// the lane is used: a later call only launches a kernel and cannot block on a missing peer).
// CPU tensors of at most kFastLaneBytes (staged bytes, all-gather outputs included) take the
// lane; its completion is polled on its own stream with the same deadline and abort as the rest.
// The blocking initialization and warm-up run on a helper thread, so a peer that dies during
// them makes creation fail within the timeout instead of hanging the caller (the helper, stuck
// in NCCL, is then abandoned and aborts its communicator if it ever returns).
constexpr int64_t kFastLaneBytes = 64 * 1024;

struct FastLaneSetup {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool abandoned = false;
  absl::Status status;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

// On the helper thread: the blocking communicator, its stream, and the warm-up.
void BuildFastLane(std::shared_ptr<FastLaneSetup> setup, ncclUniqueId id, int n, int rank,
                   int device, std::string what) {
  absl::Status status;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* buffer = nullptr;
  [&] {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      status = CudaStatus(e, what);
      return;
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    if (ncclResult_t r = ncclCommInitRankConfig(&comm, n, id, rank, &config); r != ncclSuccess) {
      status = NcclError(what, r, nullptr);
      return;
    }
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        e != cudaSuccess) {
      status = CudaStatus(e, what);
      return;
    }
    if (cudaError_t e = cudaMalloc(&buffer, kFastLaneBytes); e != cudaSuccess) {
      status = CudaStatus(e, what);
      return;
    }
    // Every collective the lane carries, at the sizes that select its protocols.
    for (size_t bytes : {size_t{8}, size_t{4096}, static_cast<size_t>(kFastLaneBytes / (n + 1))}) {
      char* data = static_cast<char*>(buffer);
      for (ncclResult_t r :
           {ncclBroadcast(data, data, bytes, ncclUint8, 0, comm, stream),
            ncclAllReduce(data, data, bytes / 8, ncclFloat64, ncclSum, comm, stream),
            ncclAllGather(data, data + bytes, bytes, ncclUint8, comm, stream)}) {
        if (r != ncclSuccess) {
          status = NcclError(what + ": warming up", r, comm);
          return;
        }
      }
    }
    if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
      status = CudaStatus(e, what + ": warming up");
    }
  }();
  if (buffer != nullptr) cudaFree(buffer);
  std::lock_guard<std::mutex> lock(setup->mu);
  if (setup->abandoned || !status.ok()) {
    if (comm != nullptr) ncclCommAbort(comm);
    if (stream != nullptr) cudaStreamDestroy(stream);
    comm = nullptr;
    stream = nullptr;
  }
  setup->status = status;
  setup->comm = comm;
  setup->stream = stream;
  setup->done = true;
  setup->cv.notify_all();
}

// Sets up the fast lane of `identity` (Note [Fast lane]); its first member publishes a second
// unique id. kDeadlineExceeded when it is not ready within `timeout`.
absl::Status SetUpFastLane(Rendezvous& rendezvous, const internal::GroupIdentity& identity,
                           int device, absl::Duration timeout, ncclComm_t& fast,
                           cudaStream_t& fast_stream) {
  const std::string what =
      absl::StrCat("setting up the fast lane of ", identity.name, " on cuda:", device);
  LOCKSTEP_ASSIGN_OR_RETURN(ncclUniqueId id,
                            ExchangeUniqueId(rendezvous, identity, "/nccl-fast-id", what));
  auto setup = std::make_shared<FastLaneSetup>();
  std::thread(BuildFastLane, setup, id, static_cast<int>(identity.global_ranks.size()),
              identity.rank, device, what)
      .detach();
  std::unique_lock<std::mutex> lock(setup->mu);
  if (!setup->cv.wait_for(lock, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)),
                          [&] { return setup->done; })) {
    setup->abandoned = true;
    return absl::DeadlineExceededError(absl::StrCat(
        what, ": not ready after ", absl::FormatDuration(timeout), "; a peer did not arrive"));
  }
  if (!setup->status.ok()) return setup->status;
  fast = setup->comm;
  fast_stream = setup->stream;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<internal::NcclGroup>> internal::NcclGroup::Create(
    const NcclTransport& transport, const WorldState& world, const GroupIdentity& identity,
    absl::Duration timeout) {
  auto group = std::make_unique<NcclGroup>(transport.cpu_staging, transport.device);
  RecordNcclCommunicatorSettings();  // Note [NCCL reads its settings at creation]
  LOCKSTEP_RETURN_IF_ERROR(
      CreateComm(*transport.rendezvous, identity, transport.device, timeout, group->comm));
  LOCKSTEP_RETURN_IF_ERROR(SetUpFastLane(*transport.rendezvous, identity, transport.device, timeout,
                                         group->fast, group->fast_stream));
  if (transport.host_lane) {
    LOCKSTEP_ASSIGN_OR_RETURN(
        group->host_lane,
        internal::HostLane::Connect(*transport.rendezvous, identity.store_key, identity.rank,
                                    static_cast<int>(identity.global_ranks.size()), timeout));
  }
  return group;
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<internal::WorldState> world,
                                   internal::GroupIdentity identity,
                                   std::shared_ptr<internal::NcclTransport> transport,
                                   std::unique_ptr<internal::NcclGroup> group)
    : TransportCommunicator(std::move(world), std::move(identity), std::move(transport),
                            std::move(group)) {}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::device() const { return transport().device; }

bool NcclCommunicator::uses_host_lane() const { return group().host_lane != nullptr; }

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    std::shared_ptr<Rendezvous> rendezvous, Options options) {
  LOCKSTEP_ASSIGN_OR_RETURN(internal::NewWorld world,
                            internal::StartWorld("nccl", rendezvous, options.timeout));
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess) {
    return CudaStatus(counted, "counting CUDA devices for an NCCL communicator");
  }
  const int device = options.device >= 0 ? options.device : rendezvous->local_rank();
  if (device >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.device >= 0 ? "device " : "LOCAL_RANK ", device, " selects CUDA device ", device,
        ", but this process sees ", count, " device(s)"));
  }
  auto transport = std::make_shared<internal::NcclTransport>();
  transport->rendezvous = rendezvous;
  transport->device = device;
  transport->cpu_staging = options.cpu_staging;
  transport->host_lane = options.host_lane;
  return CreateWorld(std::move(world), std::move(transport), options.timeout);
}

namespace {

// One in-place NCCL operation on (buffer, element count, type).
using InPlaceOp =
    std::function<ncclResult_t(void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)>;

// Runs `op` in place on `tensor` and waits for it: directly on a CUDA tensor, staged for a CPU
// tensor (Note [CPU staging]; `upload`: whether the CPU contents are needed by NCCL, not for the
// receivers of a broadcast).
// The communicator and stream a collective of `staged_bytes` CPU bytes (or a CUDA tensor, when
// `cpu` is false) runs on: the fast lane for small CPU tensors (Note [Fast lane]).
struct Lane {
  ncclComm_t* comm;
  cudaStream_t stream;
};
Lane ChooseLane(ncclComm_t& comm, ncclComm_t& fast, cudaStream_t fast_stream, int device, bool cpu,
                int64_t staged_bytes) {
  if (cpu && fast != nullptr && staged_bytes <= kFastLaneBytes) return Lane{&fast, fast_stream};
  return Lane{&comm, c10::cuda::getCurrentCUDAStream(device).stream()};
}

absl::Status InPlace(ncclComm_t& parent, ncclComm_t& fast, cudaStream_t fast_stream,
                     internal::NcclStaging& staging, int device, absl::Duration timeout,
                     const std::string& what, at::Tensor& tensor, const InPlaceOp& op,
                     bool upload) {
  LOCKSTEP_RETURN_IF_ERROR(CheckTensor(tensor, device, what));
  LOCKSTEP_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(tensor.scalar_type(), what));
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const Lane lane = ChooseLane(parent, fast, fast_stream, device, tensor.is_cpu(),
                               static_cast<int64_t>(tensor.nbytes()));
  ncclComm_t& comm = *lane.comm;
  cudaStream_t stream = lane.stream;
  const size_t count = static_cast<size_t>(tensor.numel());
  auto launch = [&](void* data) {
    return Enqueue(comm, stream, timeout, what,
                   [&](ncclComm_t c, cudaStream_t s) { return op(data, count, type, c, s); });
  };
  if (tensor.is_cuda()) {
    LOCKSTEP_RETURN_IF_ERROR(launch(tensor.data_ptr()));
    return Await(comm, stream, /*check_stream=*/true, timeout, what);
  }
  const int64_t bytes = static_cast<int64_t>(tensor.nbytes());
  if (bytes == 0) return absl::OkStatus();
  LOCKSTEP_RETURN_IF_ERROR(staging.Reserve(bytes, what));
  if (upload) {
    std::memcpy(staging.host(), tensor.data_ptr(), bytes);
    LOCKSTEP_RETURN_IF_ERROR(staging.BeforeCollective(0, bytes, stream, what));
  }
  LOCKSTEP_RETURN_IF_ERROR(launch(staging.nccl()));
  LOCKSTEP_RETURN_IF_ERROR(staging.AfterCollective(0, bytes, stream, what));
  LOCKSTEP_RETURN_IF_ERROR(Await(comm, stream, /*check_stream=*/true, timeout, what));
  std::memcpy(tensor.data_ptr(), staging.host(), bytes);
  return absl::OkStatus();
}

// Note [Host lane]
// lockstep's CPU-tensor traffic is small host data (RNG states, digests, votes) exchanged by
// processes that usually share a host. Through NCCL it crosses PCIe twice and waits for a kernel
// and a stream, zero-copy or staged (rng_nccl_benchmark measures the hand-back). When
// every member of the group is on this host, CPU tensors of at most HostLane::kMaxBytes per
// member go through a shared-memory segment instead (collectives/internal/host_lane.h): the same
// bytes, the same collective order, the same timeout; a peer that exits is kUnavailable, members
// that disagree on the collective kFailedPrecondition. Larger CPU tensors and every CUDA tensor
// keep using NCCL. The decision depends only on the group and the tensor's size, which every
// member shares, so all members take the same path.
bool TakesHostLane(const internal::HostLane* lane, const at::Tensor& tensor) {
  return lane != nullptr && tensor.defined() && tensor.is_cpu() &&
         static_cast<int64_t>(tensor.nbytes()) <= internal::HostLane::kMaxBytes;
}

// Note [Lane or group] (host_lane.h): a CPU tensor that does not take the lane is announced on
// it first (its size and `op`), so that members split between the lane and NCCL are refused, not
// stranded. `op`: 1 broadcast, 2 all-reduce, 3 all-gather.
absl::Status AnnounceOffTheLane(internal::HostLane* lane, uint32_t op, const at::Tensor& tensor,
                                const std::string& what) {
  if (lane == nullptr || !tensor.defined() || !tensor.is_cpu()) return absl::OkStatus();
  return lane->Announce(static_cast<int64_t>(tensor.nbytes()), what,
                        (op << 16) | static_cast<uint32_t>(tensor.scalar_type()));
}

// An uninitialized [size, input.sizes()...] tensor like `input`: an all-gather's output.
absl::StatusOr<at::Tensor> GatherOutput(const at::Tensor& input, int size,
                                        const std::string& what) {
  at::Tensor gathered;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(what + ": allocating the output", [&] {
    std::vector<int64_t> shape = {size};
    for (int64_t d : input.sizes()) shape.push_back(d);
    gathered = at::empty(shape, input.options());
  }));
  return gathered;
}

}  // namespace

absl::Status NcclCommunicator::Broadcast(at::Tensor& tensor, int root) {
  const std::string op = absl::StrCat("broadcast from group rank ", root);
  const std::string what = What(op);
  return Collective(op, [&]() -> absl::Status {
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": root is outside [0, ", size(), ")"));
    }
    if (TakesHostLane(group().host_lane.get(), tensor)) {
      LOCKSTEP_RETURN_IF_ERROR(CheckTensor(tensor, device(), what));
      LOCKSTEP_RETURN_IF_ERROR(NcclType(tensor.scalar_type(), what).status());
      return group().host_lane->Broadcast(tensor.data_ptr(), static_cast<int64_t>(tensor.nbytes()),
                                          root, what);
    }
    LOCKSTEP_RETURN_IF_ERROR(AnnounceOffTheLane(group().host_lane.get(), 1, tensor, what));
    // Only the root's bytes matter: the others' staging buffer is overwritten.
    return InPlace(
        group().comm, group().fast, group().fast_stream, group().staging, device(), timeout(), what,
        tensor,
        [root](void* data, size_t count, ncclDataType_t type, ncclComm_t comm,
               cudaStream_t stream) {
          return ncclBroadcast(data, data, count, type, root, comm, stream);
        },
        /*upload=*/rank() == root);
  });
}

absl::Status NcclCommunicator::AllReduceSum(at::Tensor& tensor) {
  const std::string what = What("all-reduce (sum)");
  return Collective("all-reduce (sum)", [&]() -> absl::Status {
    if (TakesHostLane(group().host_lane.get(), tensor) && tensor.scalar_type() != at::kBool) {
      // Every member gathers every contribution and adds them up in rank order, so all members
      // hold the same sum.
      LOCKSTEP_RETURN_IF_ERROR(CheckTensor(tensor, device(), what));
      LOCKSTEP_RETURN_IF_ERROR(NcclType(tensor.scalar_type(), what).status());
      LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor gathered, GatherOutput(tensor, size(), what));
      LOCKSTEP_RETURN_IF_ERROR(group().host_lane->AllGather(
          tensor.data_ptr(), static_cast<int64_t>(tensor.nbytes()), gathered.data_ptr(), what));
      return CallTorch(what + ": adding up", [&] {
        at::Tensor sum = gathered[0].clone();
        for (int m = 1; m < size(); ++m) sum.add_(gathered[m]);
        tensor.copy_(sum);
      });
    }
    LOCKSTEP_RETURN_IF_ERROR(AnnounceOffTheLane(group().host_lane.get(), 2, tensor, what));
    return InPlace(
        group().comm, group().fast, group().fast_stream, group().staging, device(), timeout(), what,
        tensor,
        [](void* data, size_t count, ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) {
          return ncclAllReduce(data, data, count, type, ncclSum, comm, stream);
        },
        /*upload=*/true);
  });
}

absl::StatusOr<std::vector<at::Tensor>> NcclCommunicator::AllGather(const at::Tensor& input) {
  return AllGatherThen(input, nullptr);
}

absl::StatusOr<std::vector<at::Tensor>> NcclCommunicator::AllGatherThen(
    const at::Tensor& input,
    const std::function<absl::Status(const std::vector<at::Tensor>&)>& then) {
  const std::string what = What("all-gather");
  std::vector<at::Tensor> outputs;
  absl::Status then_status;
  // The members' views of the output, and `then` on them.
  auto split = [&](const at::Tensor& gathered) -> absl::Status {
    LOCKSTEP_RETURN_IF_ERROR(CallTorch(what + ": splitting the output", [&] {
      for (int m = 0; m < size(); ++m) outputs.push_back(gathered[m]);
    }));
    if (then) then_status = then(outputs);
    return absl::OkStatus();
  };
  absl::Status status = Collective("all-gather", [&]() -> absl::Status {
    LOCKSTEP_RETURN_IF_ERROR(CheckTensor(input, device(), what));
    LOCKSTEP_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(input.scalar_type(), what));
    const int64_t bytes = static_cast<int64_t>(input.nbytes());
    if (TakesHostLane(group().host_lane.get(), input)) {
      LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor gathered, GatherOutput(input, size(), what));
      LOCKSTEP_RETURN_IF_ERROR(
          group().host_lane->AllGather(input.data_ptr(), bytes, gathered.data_ptr(), what));
      return split(gathered);
    }
    LOCKSTEP_RETURN_IF_ERROR(AnnounceOffTheLane(group().host_lane.get(), 3, input, what));
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device()));
    const size_t count = static_cast<size_t>(input.numel());
    const Lane lane = ChooseLane(group().comm, group().fast, group().fast_stream, device(),
                                 input.is_cpu(), bytes * (size() + 1));
    ncclComm_t& comm = *lane.comm;
    cudaStream_t stream = lane.stream;
    LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor gathered, GatherOutput(input, size(), what));
    auto launch = [&](const void* in, void* out) {
      return Enqueue(comm, stream, timeout(), what, [&](ncclComm_t c, cudaStream_t s) {
        return ncclAllGather(in, out, count, type, c, s);
      });
    };
    if (input.is_cuda()) {
      // Ordered on the current stream (ChooseLane): what `then` queues there follows the
      // gather, and the wait covers it too.
      LOCKSTEP_RETURN_IF_ERROR(launch(input.data_ptr(), gathered.data_ptr()));
      LOCKSTEP_RETURN_IF_ERROR(split(gathered));
      return Await(comm, stream, true, timeout(), what);
    }
    if (bytes > 0) {
      // Staged (Note [CPU staging]): [input | size() outputs] in the group's buffers.
      internal::NcclStaging& staging = group().staging;
      const int64_t total = bytes * (size() + 1);
      LOCKSTEP_RETURN_IF_ERROR(staging.Reserve(total, what));
      std::memcpy(staging.host(), input.data_ptr(), bytes);
      LOCKSTEP_RETURN_IF_ERROR(staging.BeforeCollective(0, bytes, stream, what));
      LOCKSTEP_RETURN_IF_ERROR(launch(staging.nccl(), staging.nccl() + bytes));
      LOCKSTEP_RETURN_IF_ERROR(staging.AfterCollective(bytes, total - bytes, stream, what));
      LOCKSTEP_RETURN_IF_ERROR(Await(comm, stream, true, timeout(), what));
      std::memcpy(gathered.data_ptr(), staging.host() + bytes, total - bytes);
    }
    return split(gathered);
  });
  if (!status.ok()) return status;
  if (!then_status.ok()) return then_status;
  return outputs;
}

absl::Status NcclCommunicator::Barrier() {
  at::Tensor token;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(What("barrier"), [&] {
    token = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(
                               at::kCUDA, static_cast<c10::DeviceIndex>(device())));
  }));
  return Annotate(AllReduceSum(token), "in barrier");
}

}  // namespace collectives
}  // namespace lockstep
