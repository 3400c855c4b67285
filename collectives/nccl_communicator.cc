#include "collectives/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"
#include "collectives/internal/group_registry.h"

namespace lockstep {
namespace collectives {

struct NcclCommunicator::Shared {
  std::shared_ptr<Rendezvous> rendezvous;
  Options options;
  int device = 0;
  internal::GroupRegistry groups;
  // Staging of CPU tensors: a pinned host buffer and a device buffer, grown on demand and reused
  // (each collective completes before the next may use them). Pinned memory lets the copies be
  // asynchronous on the collective's stream, so one wait covers upload, collective and download.
  std::mutex staging_mutex;
  at::Tensor host_staging;
  at::Tensor device_staging;
};

struct NcclCommunicator::Group {
  ncclComm_t comm = nullptr;
  bool broken = false;  // aborted after an error; no further collectives
  std::vector<int> global_ranks;
  int rank = 0;
  std::string name;
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

// Polls until `comm` leaves ncclInProgress and, when `stream` is given, the stream is idle.
// On timeout or error the communicator is aborted.
absl::Status AwaitComm(ncclComm_t& comm, bool& broken, cudaStream_t stream, bool check_stream,
                       absl::Duration timeout, const std::string& what) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t query = ncclCommGetAsyncError(comm, &state);
    if (query != ncclSuccess) state = query;
    if (state != ncclSuccess && state != ncclInProgress) {
      absl::Status error = NcclError(what, state, comm);
      ncclCommAbort(comm);
      comm = nullptr;
      broken = true;
      return error;
    }
    if (state == ncclSuccess) {
      if (!check_stream) return absl::OkStatus();
      const cudaError_t done = cudaStreamQuery(stream);
      if (done == cudaSuccess) return absl::OkStatus();
      if (done != cudaErrorNotReady) {
        ncclCommAbort(comm);
        comm = nullptr;
        broken = true;
        return absl::InternalError(absl::StrCat(what, ": CUDA ", cudaGetErrorString(done)));
      }
    }
    if (absl::Now() >= deadline) {
      ncclCommAbort(comm);
      comm = nullptr;
      broken = true;
      return absl::DeadlineExceededError(absl::StrCat(
          what, " timed out after ", absl::FormatDuration(timeout), "; a peer did not arrive"));
    }
    // Spin first: small collectives finish in microseconds, and a sleep costs at least the
    // kernel's timer slack (~50 us). Back off to sleeping once the wait is clearly long.
    if (absl::Now() - start < absl::Milliseconds(2)) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(absl::Microseconds(50));
    }
  }
}

absl::StatusOr<ncclDataType_t> NcclType(at::ScalarType type) {
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
          absl::StrCat("NCCL cannot move tensors of dtype ", c10::toString(type)));
  }
}

// Initializes a communicator of `n` ranks with `id`, non-blocking, bounded by `timeout`.
absl::Status InitComm(ncclComm_t& comm, bool& broken, int n, const ncclUniqueId& id, int rank,
                      absl::Duration timeout, const std::string& what) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclUniqueId copy = id;
  ncclResult_t result = ncclCommInitRankConfig(&comm, n, copy, rank, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    return NcclError(what, result, nullptr);
  }
  return AwaitComm(comm, broken, nullptr, /*check_stream=*/false, timeout, what);
}

absl::Status CreateGroupComm(const std::shared_ptr<Rendezvous>& rendezvous, const std::string& key,
                             int n, int rank, int device, absl::Duration timeout,
                             const std::string& what, ncclComm_t& comm, bool& broken) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  ncclUniqueId id;
  if (rank == 0) {
    ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) return NcclError(what, result, nullptr);
    absl::Status set =
        rendezvous->Set(key, absl::string_view(reinterpret_cast<const char*>(&id), sizeof(id)));
    if (!set.ok()) return set;
  } else {
    absl::StatusOr<std::string> bytes = rendezvous->Get(key);
    if (!bytes.ok()) return bytes.status();
    if (bytes->size() != sizeof(id)) {
      return absl::DataLossError(absl::StrCat(what, ": NCCL id under ", key, " has ", bytes->size(),
                                              " bytes, expected ", sizeof(id)));
    }
    std::memcpy(&id, bytes->data(), sizeof(id));
  }
  return InitComm(comm, broken, n, id, rank, timeout, what);
}

}  // namespace

NcclCommunicator::NcclCommunicator(std::shared_ptr<Shared> shared, std::unique_ptr<Group> group)
    : shared_(std::move(shared)), group_(std::move(group)) {}

NcclCommunicator::~NcclCommunicator() {
  if (group_ != nullptr && group_->comm != nullptr) {
    // Abort rather than destroy: destroy waits for outstanding work, which could be a hang.
    ncclCommAbort(group_->comm);
  }
}

int NcclCommunicator::device() const { return shared_->device; }
int NcclCommunicator::rank() const { return group_->rank; }
int NcclCommunicator::size() const { return static_cast<int>(group_->global_ranks.size()); }
const std::vector<int>& NcclCommunicator::global_ranks() const { return group_->global_ranks; }
absl::Duration NcclCommunicator::timeout() const { return shared_->options.timeout; }
std::string NcclCommunicator::DebugName() const { return group_->name; }

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    std::shared_ptr<Rendezvous> rendezvous, Options options) {
  if (rendezvous == nullptr) return absl::InvalidArgumentError("rendezvous is null");
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout ", absl::FormatDuration(options.timeout), " must be positive"));
  }
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device: ", cudaGetErrorString(counted)));
  }
  const int device = options.device >= 0 ? options.device : rendezvous->local_rank();
  if (device >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.device >= 0 ? "device " : "LOCAL_RANK ", device, " selects CUDA device ", device,
        ", but this process sees ", count, " device(s)"));
  }
  auto shared = std::make_shared<Shared>();
  shared->rendezvous = rendezvous;
  shared->options = options;
  shared->device = device;
  auto group = std::make_unique<Group>();
  group->rank = rendezvous->rank();
  for (int r = 0; r < rendezvous->world_size(); ++r) group->global_ranks.push_back(r);
  group->name = absl::StrCat("nccl world ", FormatRanks(group->global_ranks));
  // World communicators are numbered apart from sub-groups over the same ranks.
  absl::StatusOr<internal::GroupRegistry::Entry> entry = shared->groups.Register(
      "nccl-world", group->global_ranks, rendezvous->world_size(), group->rank);
  if (!entry.ok()) return entry.status();
  absl::Status status = CreateGroupComm(
      rendezvous, entry->store_key, rendezvous->world_size(), group->rank, device, options.timeout,
      absl::StrCat("creating ", group->name, " on cuda:", device), group->comm, group->broken);
  if (!status.ok()) return status;
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(shared, std::move(group)));
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::NewGroup(
    absl::Span<const int> global_ranks) {
  absl::StatusOr<internal::GroupRegistry::Entry> entry = shared_->groups.Register(
      "nccl", global_ranks, shared_->rendezvous->world_size(), group_->global_ranks[group_->rank]);
  if (!entry.ok()) return entry.status();
  auto group = std::make_unique<Group>();
  group->global_ranks = entry->global_ranks;
  group->rank = entry->member;
  group->name = entry->name;
  absl::Status status = CreateGroupComm(
      shared_->rendezvous, entry->store_key, static_cast<int>(group->global_ranks.size()),
      group->rank, shared_->device, timeout(),
      absl::StrCat("creating ", group->name, " (members must create it together)"), group->comm,
      group->broken);
  if (!status.ok()) return status;
  return std::unique_ptr<Communicator>(new NcclCommunicator(shared_, std::move(group)));
}

namespace {

// The tensor on `device` that the collective runs on: `tensor` itself when it is already a
// contiguous tensor of that device, else a device copy (staged).
absl::StatusOr<at::Tensor> OnDevice(const at::Tensor& tensor, int device, const std::string& what) {
  if (!tensor.defined()) return absl::InvalidArgumentError(what + ": tensor is undefined");
  if (!tensor.is_contiguous())
    return absl::InvalidArgumentError(what + ": tensor must be contiguous");
  if (tensor.is_cuda() && tensor.get_device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": tensor is on cuda:", tensor.get_device(), ", this communicator on cuda:", device));
  }
  if (tensor.is_cuda()) return tensor;
  if (!tensor.is_cpu()) {
    return absl::InvalidArgumentError(what + ": tensor must be on the CPU or the CUDA device");
  }
  at::Tensor staged;
  absl::Status copied = CallTorch(what + ": staging to the device", [&] {
    staged = tensor.to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device)));
  });
  if (!copied.ok()) return copied;
  return staged;
}

}  // namespace

absl::Status NcclCommunicator::InPlace(const std::string& what, at::Tensor& tensor,
                                       const InPlaceLaunch& launch, bool upload) {
  if (group_->broken) return absl::FailedPreconditionError(what + ": communicator was aborted");
  absl::StatusOr<ncclDataType_t> type = NcclType(tensor.scalar_type());
  if (!type.ok()) return type.status();
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(shared_->device));
  if (tensor.is_cpu()) return StagedInPlace(what, tensor, launch, *type, upload);
  absl::StatusOr<at::Tensor> buffer = OnDevice(tensor, shared_->device, what);
  if (!buffer.ok()) return buffer.status();
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(shared_->device).stream();
  const ncclResult_t result =
      launch(buffer->data_ptr(), buffer->numel(), *type, group_->comm, stream);
  if (result != ncclSuccess && result != ncclInProgress) {
    return NcclError(what, result, group_->comm);
  }
  return AwaitComm(group_->comm, group_->broken, stream, true, timeout(), what);
}

absl::Status NcclCommunicator::StagedInPlace(const std::string& what, at::Tensor& tensor,
                                             const InPlaceLaunch& launch, ncclDataType_t type,
                                             bool upload) {
  // InPlace has checked the dtype (so the tensor is defined); contiguity is checked here.
  if (!tensor.is_contiguous()) {
    return absl::InvalidArgumentError(what + ": tensor must be contiguous");
  }
  std::lock_guard<std::mutex> lock(shared_->staging_mutex);
  const int64_t bytes = static_cast<int64_t>(tensor.nbytes());
  if (bytes == 0) return absl::OkStatus();
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(what + ": allocating staging buffers", [&] {
    if (!shared_->host_staging.defined() || shared_->host_staging.numel() < bytes) {
      shared_->host_staging =
          at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      shared_->device_staging =
          at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(
                                 at::kCUDA, static_cast<c10::DeviceIndex>(shared_->device)));
    }
  }));
  void* host = shared_->host_staging.data_ptr();
  void* device = shared_->device_staging.data_ptr();
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(shared_->device).stream();
  if (upload) {
    std::memcpy(host, tensor.data_ptr(), bytes);
    if (cudaError_t e = cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream);
        e != cudaSuccess) {
      return absl::InternalError(
          absl::StrCat(what, ": staging to the device: ", cudaGetErrorString(e)));
    }
  }
  const ncclResult_t result = launch(device, tensor.numel(), type, group_->comm, stream);
  if (result != ncclSuccess && result != ncclInProgress) {
    return NcclError(what, result, group_->comm);
  }
  if (cudaError_t e = cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream);
      e != cudaSuccess) {
    return absl::InternalError(absl::StrCat(what, ": copying back: ", cudaGetErrorString(e)));
  }
  LOCKSTEP_RETURN_IF_ERROR(AwaitComm(group_->comm, group_->broken, stream, true, timeout(), what));
  std::memcpy(tensor.data_ptr(), host, bytes);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Broadcast(at::Tensor& tensor, int root) {
  const std::string what = absl::StrCat("broadcast from group rank ", root, " on ", DebugName());
  if (root < 0 || root >= size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": root is outside [0, ", size(), ")"));
  }
  // Only the root's bytes matter: the others' staging buffer is overwritten.
  return InPlace(
      what, tensor,
      [root](void* data, size_t count, ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) {
        return ncclBroadcast(data, data, count, type, root, comm, stream);
      },
      /*upload=*/rank() == root);
}

absl::Status NcclCommunicator::AllReduceSum(at::Tensor& tensor) {
  return InPlace(
      absl::StrCat("all-reduce (sum) on ", DebugName()), tensor,
      [](void* data, size_t count, ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) {
        return ncclAllReduce(data, data, count, type, ncclSum, comm, stream);
      });
}

absl::StatusOr<std::vector<at::Tensor>> NcclCommunicator::AllGather(const at::Tensor& input) {
  const std::string what = absl::StrCat("all-gather on ", DebugName());
  if (group_->broken) return absl::FailedPreconditionError(what + ": communicator was aborted");
  absl::StatusOr<ncclDataType_t> type = NcclType(input.scalar_type());
  if (!type.ok()) return type.status();
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(shared_->device));
  absl::StatusOr<at::Tensor> buffer = OnDevice(input, shared_->device, what);
  if (!buffer.ok()) return buffer.status();
  at::Tensor gathered;
  absl::Status allocated = CallTorch(what + ": allocating the output", [&] {
    std::vector<int64_t> shape = {size()};
    for (int64_t d : input.sizes()) shape.push_back(d);
    gathered = at::empty(shape, buffer->options());
  });
  if (!allocated.ok()) return allocated;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(shared_->device).stream();
  ncclResult_t result = ncclAllGather(buffer->data_ptr(), gathered.data_ptr(), buffer->numel(),
                                      *type, group_->comm, stream);
  if (result != ncclSuccess && result != ncclInProgress)
    return NcclError(what, result, group_->comm);
  absl::Status done = AwaitComm(group_->comm, group_->broken, stream, true, timeout(), what);
  if (!done.ok()) return done;
  std::vector<at::Tensor> outputs;
  absl::Status split = CallTorch(what + ": splitting the output", [&] {
    at::Tensor all = input.is_cuda() ? gathered : gathered.to(input.device());
    for (int m = 0; m < size(); ++m) outputs.push_back(all[m]);
  });
  if (!split.ok()) return split;
  return outputs;
}

absl::Status NcclCommunicator::Barrier() {
  at::Tensor token;
  absl::Status made = CallTorch("barrier token", [&] {
    token = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(
                               at::kCUDA, static_cast<c10::DeviceIndex>(shared_->device)));
  });
  if (!made.ok()) return made;
  absl::Status status = AllReduceSum(token);
  if (!status.ok()) return Annotate(status, "in barrier");
  return absl::OkStatus();
}

}  // namespace collectives
}  // namespace lockstep
