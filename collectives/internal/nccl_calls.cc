#include "collectives/internal/nccl_calls.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/cuda_boundary.h"
#include "base/status_macros.h"
#include "c10/core/ScalarType.h"
#include "c10/cuda/CUDAGuard.h"

namespace lockstep {
namespace collectives {
namespace internal {
namespace {

// How long Await spins before it starts sleeping.
constexpr absl::Duration kSpinBeforeSleeping = absl::Milliseconds(50);

}  // namespace

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

absl::Status Abort(ncclComm_t& comm, absl::Status error) {
  if (comm != nullptr) ncclCommAbort(comm);
  comm = nullptr;
  return error;
}

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

absl::StatusOr<ncclUniqueId> ExchangeUniqueId(Rendezvous& rendezvous, const GroupIdentity& identity,
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

absl::Status CreateComm(Rendezvous& rendezvous, const GroupIdentity& identity, int device,
                        absl::Duration timeout, ncclComm_t& comm) {
  const std::string what = absl::StrCat("creating ", identity.name, " on cuda:", device);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  LOCKSTEP_ASSIGN_OR_RETURN(ncclUniqueId id,
                            ExchangeUniqueId(rendezvous, identity, "/nccl-id", what));
  return InitComm(comm, static_cast<int>(identity.global_ranks.size()), id, identity.rank, timeout,
                  what);
}

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep
