#include "collectives/internal/process_group_calls.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/stopwatch.h"
#include "base/torch_boundary.h"
#include "collectives/internal/store.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/csrc/distributed/c10d/Work.hpp"

#if TORCH_VERSION_MAJOR >= 2
#include "torch/csrc/distributed/c10d/Backend.hpp"
#endif

namespace lockstep {
namespace collectives {
namespace internal {
namespace {

// Waits for `work`. c10d applies its own timeout inside the operation; this wait's bound is the
// communicator's, a little past it (so that the backend's own error, which names the peer's
// address, usually comes first), and holds whatever the backend's timeout is.
absl::Status Wait(const c10::intrusive_ptr<c10d::Work>& work, absl::Duration timeout,
                  const std::string& what) {
  bool completed = false;
  const absl::Duration bound = timeout + std::min(absl::Seconds(5), timeout);
  const Stopwatch waited;
  const absl::Status status =
      CallTorch(what, [&] { completed = work->wait(internal::ToChrono(bound)); });
  // c10d reports its own wait's expiry by throwing (a c10::Error like any other): told apart by
  // this wait's clock, not by the message.
  if (!status.ok() && waited.Elapsed() < bound) return status;
  if (!completed) {
    return absl::DeadlineExceededError(absl::StrCat(
        what, ": not complete after ", absl::FormatDuration(timeout), "; a peer did not arrive"));
  }
  return absl::OkStatus();
}

// Gloo refuses dtypes it cannot reduce (bfloat16, in LibTorch 2.11's Gloo) even where it only
// moves bytes; a broadcast or an all-gather of such a tensor moves its bytes instead.
bool MovesAsBytes(const at::Tensor& tensor) { return tensor.scalar_type() == at::kBFloat16; }

// A contiguous tensor's bytes, sharing its storage.
at::Tensor BytesOf(const at::Tensor& tensor) { return tensor.reshape({-1}).view(at::kByte); }

using CallKind = ProcessGroupCalls::CallKind;

std::string DescribeCall(const int64_t* fields) {
  std::string kind;
  switch (fields[0]) {
    case CallKind::kBroadcast:
      kind = absl::StrCat("broadcast from group rank ", fields[1]);
      break;
    case CallKind::kAllGather:
      kind = "all-gather";
      break;
    case CallKind::kAllReduce:
      kind = "all-reduce (sum)";
      break;
    case CallKind::kBarrier:
      return absl::StrCat("barrier (collective #", fields[4], ")");
    default:
      kind = absl::StrCat("an unknown collective (", fields[0], ")");
  }
  const std::string dtype =
      fields[2] >= 0 && fields[2] < static_cast<int64_t>(c10::ScalarType::NumOptions)
          ? std::string(c10::toString(static_cast<c10::ScalarType>(fields[2])))
          : absl::StrCat("dtype ", fields[2]);
  return absl::StrCat(kind, " of ", fields[3], " bytes of ", dtype, " (collective #", fields[4],
                      ")");
}

}  // namespace

ProcessGroupCalls::ProcessGroupCalls(c10::intrusive_ptr<C10dGroup> group,
                                     std::vector<int> global_ranks,
                                     std::optional<at::Device> staging, absl::Duration timeout)
    : group_(std::move(group)),
      global_ranks_(std::move(global_ranks)),
      staging_(staging),
      timeout_(timeout) {}

absl::StatusOr<at::Tensor> ProcessGroupCalls::Staged(const at::Tensor& tensor,
                                                     const std::string& what) const {
  if (!staging_.has_value() || !tensor.is_cpu()) return tensor;
  at::Tensor staged;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(absl::StrCat(what, ": copying to ", staging_->str()),
                                     [&] { staged = tensor.to(*staging_); }));
  return staged;
}

absl::Status ProcessGroupCalls::CheckInStep(const Call& call, const std::string& what) {
  const int64_t sequence = calls_++;
  at::Tensor mine;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] {
    mine = at::tensor(std::vector<int64_t>{call.kind, call.root, call.dtype, call.bytes, sequence},
                      at::kLong);
  }));
  LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor staged, Staged(mine, what));
  std::vector<std::vector<at::Tensor>> everyone(1);
  c10::intrusive_ptr<c10d::Work> work;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] {
    for (int m = 0; m < size(); ++m) everyone[0].push_back(at::empty_like(staged));
    std::vector<at::Tensor> inputs = {staged};
    work = group_->allgather(everyone, inputs);
  }));
  LOCKSTEP_RETURN_IF_ERROR(Wait(work, timeout_, what));
  std::vector<at::Tensor> calls(size());
  bool in_step = true;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] {
    for (int m = 0; m < size(); ++m) {
      calls[m] = everyone[0][m].to(at::kCPU).contiguous();
      in_step = in_step && at::equal(calls[m], mine);
    }
  }));
  if (in_step) return absl::OkStatus();
  std::string described;
  for (int m = 0; m < size(); ++m) {
    absl::StrAppend(&described, m == 0 ? "" : "; ", "group rank ", m, " (global rank ",
                    global_ranks_[m], ") called ", DescribeCall(calls[m].data_ptr<int64_t>()));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": the members are out of step (", described,
                   "); no data moved, and the communicator is unusable"));
}

absl::Status ProcessGroupCalls::Broadcast(at::Tensor& tensor, int root, const std::string& what) {
  if (root < 0 || root >= size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": root is outside [0, ", size(), ")"));
  }
  LOCKSTEP_RETURN_IF_ERROR(CheckContiguous(tensor, what));
  LOCKSTEP_RETURN_IF_ERROR(
      CheckInStep(Call{kBroadcast, root, static_cast<int64_t>(tensor.scalar_type()),
                       static_cast<int64_t>(tensor.nbytes())},
                  what));
  LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor staged, Staged(tensor, what));
  c10::intrusive_ptr<c10d::Work> work;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] {
    std::vector<at::Tensor> tensors = {MovesAsBytes(staged) ? BytesOf(staged) : staged};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    options.rootTensor = 0;
    work = group_->broadcast(tensors, options);
  }));
  LOCKSTEP_RETURN_IF_ERROR(Wait(work, timeout_, what));
  if (staged.is_same(tensor)) return absl::OkStatus();
  return CallTorch(what + ": copying back", [&] { tensor.copy_(staged); });
}

absl::StatusOr<std::vector<at::Tensor>> ProcessGroupCalls::AllGather(const at::Tensor& input,
                                                                     const std::string& what) {
  LOCKSTEP_RETURN_IF_ERROR(CheckContiguous(input, what));
  LOCKSTEP_RETURN_IF_ERROR(
      CheckInStep(Call{kAllGather, -1, static_cast<int64_t>(input.scalar_type()),
                       static_cast<int64_t>(input.nbytes())},
                  what));
  LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor staged, Staged(input, what));
  std::vector<std::vector<at::Tensor>> outputs(1);
  c10::intrusive_ptr<c10d::Work> work;
  const bool as_bytes = MovesAsBytes(staged);
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] {
    std::vector<at::Tensor> inputs = {as_bytes ? BytesOf(staged) : staged};
    for (int m = 0; m < size(); ++m) outputs[0].push_back(at::empty_like(inputs[0]));
    work = group_->allgather(outputs, inputs);
  }));
  LOCKSTEP_RETURN_IF_ERROR(Wait(work, timeout_, what));
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] {
    for (at::Tensor& output : outputs[0]) {
      if (as_bytes) output = output.view(input.scalar_type()).reshape(input.sizes());
      if (!staged.is_same(input)) output = output.to(input.device());
    }
  }));
  return std::move(outputs[0]);
}

absl::Status ProcessGroupCalls::AllReduceSum(at::Tensor& tensor, const std::string& what) {
  LOCKSTEP_RETURN_IF_ERROR(CheckContiguous(tensor, what));
  LOCKSTEP_RETURN_IF_ERROR(
      CheckInStep(Call{kAllReduce, -1, static_cast<int64_t>(tensor.scalar_type()),
                       static_cast<int64_t>(tensor.nbytes())},
                  what));
  LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor staged, Staged(tensor, what));
  c10::intrusive_ptr<c10d::Work> work;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] {
    std::vector<at::Tensor> tensors = {staged};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    work = group_->allreduce(tensors, options);
  }));
  LOCKSTEP_RETURN_IF_ERROR(Wait(work, timeout_, what));
  if (staged.is_same(tensor)) return absl::OkStatus();
  return CallTorch(what + ": copying back", [&] { tensor.copy_(staged); });
}

absl::Status ProcessGroupCalls::Barrier(const std::string& what) {
  LOCKSTEP_RETURN_IF_ERROR(CheckInStep(Call{kBarrier, -1, -1, 0}, what));
  if (staging_.has_value()) {
    // A staged group's barrier is an all-reduce of one element on its device: c10d's own NCCL
    // barrier guesses the device from the rank.
    at::Tensor token = at::zeros({1}, at::kInt);
    LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor staged, Staged(token, what));
    c10::intrusive_ptr<c10d::Work> work;
    LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] {
      std::vector<at::Tensor> tensors = {staged};
      work = group_->allreduce(tensors, c10d::AllreduceOptions());
    }));
    LOCKSTEP_RETURN_IF_ERROR(Wait(work, timeout_, what));
    return CallTorch(what, [&] { (void)staged.to(at::kCPU); });
  }
  c10::intrusive_ptr<c10d::Work> work;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] { work = group_->barrier(); }));
  return Wait(work, timeout_, what);
}

// Gloo's TCP pairs write with writev, which raises SIGPIPE when the peer has closed its end; at
// SIGPIPE's default disposition that kills this process, so a peer's death would take its
// survivors with it instead of becoming their error (seen in a world of 4: a survivor killed by
// SIGPIPE mid-collective). Ignored, the write fails with EPIPE and Gloo reports it. A handler
// the program installed is left alone: the write still fails with EPIPE once it returns.
absl::Status IgnoreSigpipeAtDefault() {
  struct sigaction current;
  if (sigaction(SIGPIPE, nullptr, &current) != 0) {
    return absl::InternalError(
        absl::StrCat("reading SIGPIPE's disposition: ", std::strerror(errno)));
  }
  if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) {
    return absl::OkStatus();
  }
  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  if (sigaction(SIGPIPE, &ignore, nullptr) != 0) {
    return absl::InternalError(absl::StrCat("ignoring SIGPIPE: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status CheckContiguous(const at::Tensor& tensor, const std::string& what) {
  if (!tensor.defined()) return absl::InvalidArgumentError(what + ": tensor is undefined");
  if (!tensor.is_contiguous()) {
    return absl::InvalidArgumentError(what + ": tensor must be contiguous");
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep
