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
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"
#include "collectives/internal/host_lane.h"

namespace lockstep {
namespace collectives {

struct NcclCommunicator::Transport {
  std::shared_ptr<Rendezvous> rendezvous;
  int device = 0;
  CpuStaging cpu_staging = CpuStaging::kMappedHost;
  bool host_lane = true;
};

namespace {

absl::Status CudaError(const std::string& what, cudaError_t error) {
  return CudaStatus(error, what);
}

// Note [CPU staging]
// How a CPU tensor reaches NCCL, per communicator, grown on demand and reused (each collective
// completes before the next may use the buffers):
//   kMappedHost   one pinned host buffer, mapped into the device's address space; NCCL's kernels
//                 read and write it directly (zero-copy), so nothing but the collective is
//                 queued and one wait covers it. For the small, latency-bound tensors lockstep
//                 moves (RNG states, digests) this saves two copies and their scheduling.
//   kDeviceCopies a pinned host buffer and a device buffer; the upload, the collective and the
//                 download are queued on one stream and waited for once.
class Staging {
 public:
  Staging(NcclCommunicator::CpuStaging mode, int device) : mode_(mode), device_(device) {}
  ~Staging() { FreeMapped(); }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // Makes room for `bytes` bytes.
  absl::Status Reserve(int64_t bytes, const std::string& what) {
    if (bytes <= capacity_) return absl::OkStatus();
    if (mode_ == NcclCommunicator::CpuStaging::kMappedHost) {
      FreeMapped();
      void* host = nullptr;
      if (cudaError_t e = cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
          e != cudaSuccess) {
        return CudaError(what + ": allocating mapped staging memory", e);
      }
      void* alias = nullptr;
      if (cudaError_t e = cudaHostGetDevicePointer(&alias, host, 0); e != cudaSuccess) {
        cudaFreeHost(host);
        return CudaError(what + ": mapping staging memory into the device", e);
      }
      mapped_host_ = static_cast<char*>(host);
      mapped_device_ = static_cast<char*>(alias);
    } else {
      LOCKSTEP_RETURN_IF_ERROR(CallTorch(what + ": allocating staging buffers", [&] {
        host_ = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
        device_buffer_ = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(
                                                at::kCUDA, static_cast<c10::DeviceIndex>(device_)));
      }));
    }
    capacity_ = bytes;
    return absl::OkStatus();
  }

  // Where the CPU side reads and writes.
  char* host() {
    return mode_ == NcclCommunicator::CpuStaging::kMappedHost
               ? mapped_host_
               : static_cast<char*>(host_.data_ptr());
  }
  // The address NCCL operates on.
  char* nccl() {
    return mode_ == NcclCommunicator::CpuStaging::kMappedHost
               ? mapped_device_
               : static_cast<char*>(device_buffer_.data_ptr());
  }
  // Queues what must precede NCCL's reads of [offset, offset + bytes).
  absl::Status BeforeCollective(int64_t offset, int64_t bytes, cudaStream_t stream,
                                const std::string& what) {
    if (mode_ == NcclCommunicator::CpuStaging::kMappedHost || bytes == 0) return absl::OkStatus();
    return Copy(nccl() + offset, host() + offset, bytes, cudaMemcpyHostToDevice, stream,
                what + ": staging to the device");
  }
  // Queues what must follow NCCL's writes of [offset, offset + bytes).
  absl::Status AfterCollective(int64_t offset, int64_t bytes, cudaStream_t stream,
                               const std::string& what) {
    if (mode_ == NcclCommunicator::CpuStaging::kMappedHost || bytes == 0) return absl::OkStatus();
    return Copy(host() + offset, nccl() + offset, bytes, cudaMemcpyDeviceToHost, stream,
                what + ": copying back");
  }

 private:
  static absl::Status Copy(void* to, const void* from, int64_t bytes, cudaMemcpyKind kind,
                           cudaStream_t stream, const std::string& what) {
    if (cudaError_t e = cudaMemcpyAsync(to, from, bytes, kind, stream); e != cudaSuccess) {
      return CudaError(what, e);
    }
    return absl::OkStatus();
  }
  void FreeMapped() {
    if (mapped_host_ != nullptr) cudaFreeHost(mapped_host_);
    mapped_host_ = mapped_device_ = nullptr;
  }

  NcclCommunicator::CpuStaging mode_;
  int device_;
  int64_t capacity_ = 0;
  char* mapped_host_ = nullptr;    // kMappedHost
  char* mapped_device_ = nullptr;  // its device alias
  at::Tensor host_;                // kDeviceCopies
  at::Tensor device_buffer_;
};

}  // namespace

struct NcclCommunicator::Group {
  // The group's NCCL communicator, its fast lane and (with Transport::host_lane) its host lane.
  static absl::StatusOr<std::unique_ptr<Group>> Create(const Transport& transport,
                                                       const internal::GroupIdentity& identity,
                                                       absl::Duration timeout);
  Group(CpuStaging mode, int device) : staging(mode, device) {}
  ~Group() {
    // Abort rather than destroy: destroy waits for outstanding work, which could be a hang.
    if (comm != nullptr) ncclCommAbort(comm);
    if (fast != nullptr) ncclCommAbort(fast);
    if (fast_stream != nullptr) cudaStreamDestroy(fast_stream);
  }

  ncclComm_t comm = nullptr;  // non-blocking; null once aborted
  Staging staging;            // Note [CPU staging]
  // The fast lane (Note [Fast lane]): a blocking communicator over the same members, on a
  // stream of its own, for small CPU tensors. Null when it could not be set up.
  ncclComm_t fast = nullptr;
  cudaStream_t fast_stream = nullptr;
  // The host lane (Note [Host lane]); null when off or when a member is on another host.
  std::unique_ptr<internal::HostLane> host_lane;
};

namespace {

absl::Status NcclError(const std::string& what, ncclResult_t result, ncclComm_t comm) {
  std::string detail = ncclGetErrorString(result);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') absl::StrAppend(&detail, " (", last, ")");
  }
  const std::string text = absl::StrCat(what, ": NCCL ", detail);
  if (result == ncclRemoteError || result == ncclSystemError) return absl::UnavailableError(text);
  if (result == ncclInvalidArgument || result == ncclInvalidUsage) {
    return absl::InvalidArgumentError(text);
  }
  return absl::InternalError(text);
}

// Aborts the group's NCCL communicator and returns `error`.
absl::Status Abort(ncclComm_t& comm, absl::Status error) {
  if (comm != nullptr) ncclCommAbort(comm);
  comm = nullptr;
  return error;
}

// How long Await spins before it starts sleeping.
constexpr absl::Duration kSpinBeforeSleeping = absl::Milliseconds(50);

// Polls until `comm` leaves ncclInProgress (check_stream false: the operation is enqueued) or,
// with check_stream, until the stream is idle. The stream is polled every round and NCCL's
// asynchronous error state every 32nd (it takes a lock), so a completed collective is seen within
// a microsecond or two while a failed or late peer still ends the wait. On timeout or error the
// communicator is aborted.
absl::Status Await(ncclComm_t& comm, cudaStream_t stream, bool check_stream, absl::Duration timeout,
                   const std::string& what) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  for (int round = 0;; ++round) {
    if (check_stream) {
      const cudaError_t done = cudaStreamQuery(stream);
      if (done == cudaSuccess) return absl::OkStatus();
      if (done != cudaErrorNotReady) {
        return Abort(comm, CudaStatus(done, what));
      }
    }
    if (!check_stream || round % 32 == 0) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
      if (query != ncclSuccess) state = query;
      if (state != ncclSuccess && state != ncclInProgress) {
        return Abort(comm, NcclError(what, state, comm));
      }
      if (!check_stream && state == ncclSuccess) return absl::OkStatus();
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return Abort(comm, absl::DeadlineExceededError(absl::StrCat(what, " timed out after ",
                                                                  absl::FormatDuration(timeout),
                                                                  "; a peer did not arrive")));
    }
    // Spin (yielding the core), as a CUDA synchronize does by default: a sleep costs at least
    // the kernel's timer slack (~50 us), and the wait usually ends when the GPU finishes work
    // queued before the collective (a forward pass of milliseconds), so a sleep would add its
    // slack to every such wait, late by up to a step each time. A wait longer
    // than kSpinBeforeSleeping is a late peer or a long kernel: it sleeps a thousandth of the time
    // waited so far (at most 1 ms), so noticing the end costs at most ~0.1% of the wait.
    const absl::Duration waited = now - start;
    if (waited < kSpinBeforeSleeping) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(std::min(waited / 1000, absl::Milliseconds(1)));
    }
  }
}

// Note [Non-blocking enqueue]
// lockstep's NCCL communicators are non-blocking (config.blocking = 0), so that no call can
// hang. In that mode a collective may return ncclInProgress before NCCL has enqueued its kernel
// on the stream. Anything queued on the stream right after it — the device-to-host copy of a
// staged result, the next collective — could then run before the collective does and read its
// stale input. So every collective call goes through Enqueue, which, on ncclInProgress, waits
// for the communicator's state to leave ncclInProgress (the kernel is then on the stream)
// before the caller queues more work. Seen on two H200s: a broadcast receiver copied its
// staging buffer back before the broadcast ran and "received" stale bytes.
template <typename Launch>
absl::Status Enqueue(ncclComm_t& comm, cudaStream_t stream, absl::Duration timeout,
                     const std::string& what, const Launch& launch) {
  const ncclResult_t result = launch(comm, stream);
  if (result == ncclSuccess) return absl::OkStatus();
  if (result != ncclInProgress) return Abort(comm, NcclError(what, result, comm));
  return Await(comm, stream, /*check_stream=*/false, timeout, what);
}

absl::StatusOr<ncclDataType_t> NcclType(at::ScalarType type, const std::string& what) {
  switch (type) {
    case at::kByte:
    case at::kBool:
      return ncclUint8;
    case at::kChar:
      return ncclInt8;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": NCCL cannot move tensors of dtype ", c10::toString(type)));
  }
}

// Checks a collective's tensor: defined, contiguous, on the CPU or on this device.
absl::Status CheckTensor(const at::Tensor& tensor, int device, const std::string& what) {
  if (!tensor.defined()) return absl::InvalidArgumentError(what + ": tensor is undefined");
  if (!tensor.is_contiguous()) {
    return absl::InvalidArgumentError(what + ": tensor must be contiguous");
  }
  if (tensor.is_cuda() && tensor.get_device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": tensor is on cuda:", tensor.get_device(), ", this communicator on cuda:", device));
  }
  if (!tensor.is_cuda() && !tensor.is_cpu()) {
    return absl::InvalidArgumentError(what + ": tensor must be on the CPU or the CUDA device");
  }
  return absl::OkStatus();
}

// Initializes a communicator of `n` ranks with `id`, non-blocking, bounded by `timeout`.
absl::Status InitComm(ncclComm_t& comm, int n, const ncclUniqueId& id, int rank,
                      absl::Duration timeout, const std::string& what) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclUniqueId copy = id;
  ncclResult_t result = ncclCommInitRankConfig(&comm, n, copy, rank, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    return Abort(comm, NcclError(what, result, nullptr));
  }
  return Await(comm, nullptr, /*check_stream=*/false, timeout, what);
}

// The NCCL unique id of one communicator of `identity`: its first member makes it and publishes
// it under the group's store key + `suffix`, the others read it.
absl::StatusOr<ncclUniqueId> ExchangeUniqueId(Rendezvous& rendezvous,
                                              const internal::GroupIdentity& identity,
                                              absl::string_view suffix, const std::string& what) {
  ncclUniqueId id;
  const std::string key = absl::StrCat(identity.store_key, suffix);
  if (identity.rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return NcclError(what, r, nullptr);
    }
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
        rendezvous.Set(key, absl::string_view(reinterpret_cast<const char*>(&id), sizeof(id))),
        what);
    return id;
  }
  absl::StatusOr<std::string> bytes = rendezvous.Get(key);
  if (!bytes.ok()) return Annotate(bytes.status(), what);
  if (bytes->size() != sizeof(id)) {
    return absl::DataLossError(absl::StrCat(what, ": NCCL id under ", key, " has ", bytes->size(),
                                            " bytes, expected ", sizeof(id)));
  }
  std::memcpy(&id, bytes->data(), sizeof(id));
  return id;
}

// Creates the NCCL communicator of `identity` on `device` (ExchangeUniqueId, then InitComm).
absl::Status CreateComm(Rendezvous& rendezvous, const internal::GroupIdentity& identity, int device,
                        absl::Duration timeout, ncclComm_t& comm) {
  const std::string what = absl::StrCat("creating ", identity.name, " on cuda:", device);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  LOCKSTEP_ASSIGN_OR_RETURN(ncclUniqueId id,
                            ExchangeUniqueId(rendezvous, identity, "/nccl-id", what));
  return InitComm(comm, static_cast<int>(identity.global_ranks.size()), id, identity.rank, timeout,
                  what);
}

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
      status = CudaError(what, e);
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
      status = CudaError(what, e);
      return;
    }
    if (cudaError_t e = cudaMalloc(&buffer, kFastLaneBytes); e != cudaSuccess) {
      status = CudaError(what, e);
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
      status = CudaError(what + ": warming up", e);
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

absl::StatusOr<std::unique_ptr<NcclCommunicator::Group>> NcclCommunicator::Group::Create(
    const Transport& transport, const internal::GroupIdentity& identity, absl::Duration timeout) {
  auto group = std::make_unique<Group>(transport.cpu_staging, transport.device);
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
                                   std::shared_ptr<Transport> transport,
                                   std::unique_ptr<Group> group)
    : CommunicatorBase(std::move(world), std::move(identity)),
      transport_(std::move(transport)),
      group_(std::move(group)) {}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::device() const { return transport_->device; }

bool NcclCommunicator::uses_host_lane() const { return group_->host_lane != nullptr; }

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
  auto transport = std::make_shared<Transport>();
  transport->rendezvous = rendezvous;
  transport->device = device;
  transport->cpu_staging = options.cpu_staging;
  transport->host_lane = options.host_lane;
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Group> group,
                            Group::Create(*transport, world.identity, options.timeout));
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(
      std::move(world.state), std::move(world.identity), std::move(transport), std::move(group)));
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::CreateGroup(
    internal::GroupIdentity identity) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Group> group,
                            Group::Create(*transport_, identity, timeout()));
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(world_state(), std::move(identity), transport_, std::move(group)));
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
                     Staging& staging, int device, absl::Duration timeout, const std::string& what,
                     at::Tensor& tensor, const InPlaceOp& op, bool upload) {
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
    if (TakesHostLane(group_->host_lane.get(), tensor)) {
      LOCKSTEP_RETURN_IF_ERROR(CheckTensor(tensor, device(), what));
      LOCKSTEP_RETURN_IF_ERROR(NcclType(tensor.scalar_type(), what).status());
      return group_->host_lane->Broadcast(tensor.data_ptr(), static_cast<int64_t>(tensor.nbytes()),
                                          root, what);
    }
    // Only the root's bytes matter: the others' staging buffer is overwritten.
    return InPlace(
        group_->comm, group_->fast, group_->fast_stream, group_->staging, device(), timeout(), what,
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
    if (TakesHostLane(group_->host_lane.get(), tensor) && tensor.scalar_type() != at::kBool) {
      // Every member gathers every contribution and adds them up in rank order, so all members
      // hold the same sum.
      LOCKSTEP_RETURN_IF_ERROR(CheckTensor(tensor, device(), what));
      LOCKSTEP_RETURN_IF_ERROR(NcclType(tensor.scalar_type(), what).status());
      LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor gathered, GatherOutput(tensor, size(), what));
      LOCKSTEP_RETURN_IF_ERROR(group_->host_lane->AllGather(
          tensor.data_ptr(), static_cast<int64_t>(tensor.nbytes()), gathered.data_ptr(), what));
      return CallTorch(what + ": adding up", [&] {
        at::Tensor sum = gathered[0].clone();
        for (int m = 1; m < size(); ++m) sum.add_(gathered[m]);
        tensor.copy_(sum);
      });
    }
    return InPlace(
        group_->comm, group_->fast, group_->fast_stream, group_->staging, device(), timeout(), what,
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
    if (TakesHostLane(group_->host_lane.get(), input)) {
      LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor gathered, GatherOutput(input, size(), what));
      LOCKSTEP_RETURN_IF_ERROR(
          group_->host_lane->AllGather(input.data_ptr(), bytes, gathered.data_ptr(), what));
      return split(gathered);
    }
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device()));
    const size_t count = static_cast<size_t>(input.numel());
    const Lane lane = ChooseLane(group_->comm, group_->fast, group_->fast_stream, device(),
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
      Staging& staging = group_->staging;
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
