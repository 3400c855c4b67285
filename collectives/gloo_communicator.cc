#include "collectives/gloo_communicator.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/stopwatch.h"
#include "base/torch_boundary.h"
#include "collectives/internal/host_lane.h"
#include "collectives/internal/store.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"

namespace lockstep {
namespace collectives {

struct GlooCommunicator::Transport {
  std::shared_ptr<Rendezvous> rendezvous;
  std::shared_ptr<::gloo::transport::Device> device;
  absl::Duration engine_timeout;  // Gloo's own, inside each operation
};

struct GlooCommunicator::Group {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> process_group;
  std::unique_ptr<internal::HostLane> host_lane;  // adopted groups on one host; else null
};

namespace {

// A process group over `identity`'s members, meeting under its store key.
absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroupGloo>> MakeProcessGroup(
    const internal::GroupIdentity& identity, const std::shared_ptr<Rendezvous>& rendezvous,
    const std::shared_ptr<::gloo::transport::Device>& device, absl::Duration timeout) {
  // `timeout` here is Gloo's own (Options::engine_timeout, else the communicator's).
  c10::intrusive_ptr<c10d::ProcessGroupGloo> process_group;
  LOCKSTEP_RETURN_IF_ERROR(
      CallTorch(absl::StrCat("creating ", identity.name, " as its rank ", identity.rank), [&] {
        auto options = c10d::ProcessGroupGloo::Options::create(internal::ToChrono(timeout));
        options->devices = {device};
        auto store =
            c10::make_intrusive<c10d::PrefixStore>(identity.store_key, rendezvous->impl().store);
        process_group = c10::make_intrusive<c10d::ProcessGroupGloo>(
            store, identity.rank, static_cast<int>(identity.global_ranks.size()), options);
      }));
  return process_group;
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

// Waits for `work`. Gloo applies its own timeout inside the operation; this wait's bound is the
// communicator's, a little past it (so that Gloo's own error, which names the peer's address,
// usually comes first), and holds whatever Gloo's timeout is.
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

absl::Status CheckTensor(const at::Tensor& tensor, const std::string& what) {
  if (!tensor.defined()) return absl::InvalidArgumentError(what + ": tensor is undefined");
  if (!tensor.is_contiguous()) {
    return absl::InvalidArgumentError(what + ": tensor must be contiguous");
  }
  return absl::OkStatus();
}

// Gloo refuses dtypes it cannot reduce (bfloat16, in LibTorch 2.11's Gloo) even where it only
// moves bytes; a broadcast or an all-gather of such a tensor moves its bytes instead.
bool MovesAsBytes(const at::Tensor& tensor) { return tensor.scalar_type() == at::kBFloat16; }

// A contiguous tensor's bytes, sharing its storage.
at::Tensor BytesOf(const at::Tensor& tensor) { return tensor.reshape({-1}).view(at::kByte); }

// An adopted group's small CPU tensors go through its host lane (Note [Host lane] in
// nccl_communicator.cc), which checks itself that the members call the same collective (kind,
// root and size), so they skip the in-step exchange. The choice depends only on the group and the
// tensor's device and size, which the members share.
bool TakesHostLane(const internal::HostLane* lane, const at::Tensor& tensor) {
  return lane != nullptr && tensor.is_cpu() &&
         static_cast<int64_t>(tensor.nbytes()) <= internal::HostLane::kMaxBytes;
}

// An uninitialized [size, input.sizes()...] tensor like `input`: a lane all-gather's output.
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

enum CallKind : int64_t { kBroadcast = 1, kAllGather = 2, kAllReduce = 3, kBarrier = 4 };

// The in-step exchange's record of one member's call: its fields and the call's sequence number.
constexpr int64_t kCallFields = 5;

std::string DescribeCall(const int64_t* fields) {
  std::string kind;
  switch (fields[0]) {
    case kBroadcast:
      kind = absl::StrCat("broadcast from group rank ", fields[1]);
      break;
    case kAllGather:
      kind = "all-gather";
      break;
    case kAllReduce:
      kind = "all-reduce (sum)";
      break;
    case kBarrier:
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

GlooCommunicator::GlooCommunicator(std::shared_ptr<internal::WorldState> world,
                                   internal::GroupIdentity identity,
                                   std::shared_ptr<Transport> transport,
                                   std::unique_ptr<Group> group)
    : CommunicatorBase(std::move(world), std::move(identity)),
      transport_(std::move(transport)),
      group_(std::move(group)) {}

GlooCommunicator::~GlooCommunicator() = default;

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    std::shared_ptr<Rendezvous> rendezvous, Options options) {
  LOCKSTEP_RETURN_IF_ERROR(IgnoreSigpipeAtDefault());
  LOCKSTEP_ASSIGN_OR_RETURN(internal::NewWorld world,
                            internal::StartWorld("gloo", rendezvous, options.timeout));
  auto transport = std::make_shared<Transport>();
  transport->rendezvous = rendezvous;
  transport->engine_timeout =
      options.engine_timeout > absl::ZeroDuration() ? options.engine_timeout : options.timeout;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("creating Gloo's transport device", [&] {
    transport->device = options.hostname.empty()
                            ? c10d::ProcessGroupGloo::createDefaultDevice()
                            : c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname);
  }));
  auto group = std::make_unique<Group>();
  LOCKSTEP_ASSIGN_OR_RETURN(
      group->process_group,
      MakeProcessGroup(world.identity, rendezvous, transport->device, transport->engine_timeout));
  return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(
      std::move(world.state), std::move(world.identity), std::move(transport), std::move(group)));
}

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Adopt(
    c10::intrusive_ptr<c10d::ProcessGroupGloo> process_group, std::vector<int> global_ranks,
    int world_size, absl::Duration timeout) {
  return Adopt(std::move(process_group), std::move(global_ranks), world_size, timeout,
               c10::intrusive_ptr<c10d::Store>(), "");
}

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Adopt(
    c10::intrusive_ptr<c10d::ProcessGroupGloo> process_group, std::vector<int> global_ranks,
    int world_size, absl::Duration timeout, c10::intrusive_ptr<c10d::Store> store,
    const std::string& lane_key) {
  if (!process_group) return absl::InvalidArgumentError("adopting a Gloo group: the group is null");
  LOCKSTEP_RETURN_IF_ERROR(internal::ValidateTimeout(timeout));
  const int size = process_group->getSize();
  const int rank = process_group->getRank();
  const std::string what =
      absl::StrCat("adopting a Gloo group of ", size, " members as ", FormatRanks(global_ranks));
  if (static_cast<int>(global_ranks.size()) != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the list has ", global_ranks.size(), " ranks, the group ", size));
  }
  if (world_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": world size ", world_size, " <= 0"));
  }
  LOCKSTEP_RETURN_IF_ERROR(
      ValidateGroupRanks(global_ranks, world_size, global_ranks.at(rank)).status());
  LOCKSTEP_RETURN_IF_ERROR(IgnoreSigpipeAtDefault());
  auto world = std::make_shared<internal::WorldState>("gloo", world_size, timeout);
  internal::GroupIdentity identity;
  identity.global_ranks = std::move(global_ranks);
  identity.rank = rank;
  identity.name = absl::StrCat("adopted gloo group ", FormatRanks(identity.global_ranks));
  auto group = std::make_unique<Group>();
  group->process_group = std::move(process_group);
  if (store) {
    if (lane_key.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": the host lane's key is empty"));
    }
    auto impl = std::make_unique<Rendezvous::Impl>();
    LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] {
      impl->store = c10::make_intrusive<c10d::PrefixStore>("lockstep", std::move(store));
    }));
    LOCKSTEP_ASSIGN_OR_RETURN(std::shared_ptr<Rendezvous> rendezvous,
                              Rendezvous::OverStore(std::move(impl), identity.global_ranks.at(rank),
                                                    world_size, timeout));
    LOCKSTEP_ASSIGN_OR_RETURN(
        group->host_lane, internal::HostLane::Connect(*rendezvous, lane_key, rank, size, timeout));
  }
  return std::unique_ptr<GlooCommunicator>(
      new GlooCommunicator(std::move(world), std::move(identity), nullptr, std::move(group)));
}

bool GlooCommunicator::has_host_lane() const { return group_->host_lane != nullptr; }

absl::StatusOr<std::unique_ptr<Communicator>> GlooCommunicator::CreateGroup(
    internal::GroupIdentity identity) {
  if (transport_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("creating a group from ", DebugName(),
                     ": an adopted group makes no sub-groups; create it with the program's own "
                     "library (torch.distributed.new_group) and adopt it"));
  }
  auto group = std::make_unique<Group>();
  LOCKSTEP_ASSIGN_OR_RETURN(group->process_group,
                            MakeProcessGroup(identity, transport_->rendezvous, transport_->device,
                                             transport_->engine_timeout));
  return std::unique_ptr<Communicator>(
      new GlooCommunicator(world_state(), std::move(identity), transport_, std::move(group)));
}

absl::Status GlooCommunicator::CheckInStep(const Call& call, const std::string& what) {
  const int64_t sequence = calls_++;
  at::Tensor mine;
  std::vector<std::vector<at::Tensor>> everyone(1);
  c10::intrusive_ptr<c10d::Work> work;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] {
    mine = at::tensor(std::vector<int64_t>{call.kind, call.root, call.dtype, call.bytes, sequence},
                      at::kLong);
    for (int m = 0; m < size(); ++m) everyone[0].push_back(at::empty_like(mine));
    std::vector<at::Tensor> inputs = {mine};
    work = group_->process_group->allgather(everyone, inputs);
  }));
  LOCKSTEP_RETURN_IF_ERROR(Wait(work, timeout(), what));
  bool in_step = true;
  for (const at::Tensor& theirs : everyone[0]) in_step = in_step && at::equal(theirs, mine);
  if (in_step) return absl::OkStatus();
  std::string calls;
  for (int m = 0; m < size(); ++m) {
    const at::Tensor fields = everyone[0][m].contiguous();
    absl::StrAppend(&calls, m == 0 ? "" : "; ", "group rank ", m, " (global rank ",
                    global_ranks()[m], ") called ", DescribeCall(fields.data_ptr<int64_t>()));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": the members are out of step (", calls,
                   "); no data moved, and the communicator is unusable"));
}

absl::Status GlooCommunicator::Broadcast(at::Tensor& tensor, int root) {
  const std::string op = absl::StrCat("broadcast from group rank ", root);
  const std::string what = What(op);
  return Collective(op, [&]() -> absl::Status {
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": root is outside [0, ", size(), ")"));
    }
    LOCKSTEP_RETURN_IF_ERROR(CheckTensor(tensor, what));
    if (TakesHostLane(group_->host_lane.get(), tensor)) {
      return group_->host_lane->Broadcast(tensor.data_ptr(), static_cast<int64_t>(tensor.nbytes()),
                                          root, what);
    }
    LOCKSTEP_RETURN_IF_ERROR(
        CheckInStep(Call{kBroadcast, root, static_cast<int64_t>(tensor.scalar_type()),
                         static_cast<int64_t>(tensor.nbytes())},
                    what));
    c10::intrusive_ptr<c10d::Work> work;
    LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] {
      std::vector<at::Tensor> tensors = {MovesAsBytes(tensor) ? BytesOf(tensor) : tensor};
      c10d::BroadcastOptions options;
      options.rootRank = root;
      options.rootTensor = 0;
      work = group_->process_group->broadcast(tensors, options);
    }));
    return Wait(work, timeout(), what);
  });
}

absl::StatusOr<std::vector<at::Tensor>> GlooCommunicator::AllGather(const at::Tensor& input) {
  const std::string what = What("all-gather");
  std::vector<std::vector<at::Tensor>> outputs(1);
  absl::Status status = Collective("all-gather", [&]() -> absl::Status {
    LOCKSTEP_RETURN_IF_ERROR(CheckTensor(input, what));
    if (TakesHostLane(group_->host_lane.get(), input)) {
      LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor gathered, GatherOutput(input, size(), what));
      LOCKSTEP_RETURN_IF_ERROR(group_->host_lane->AllGather(
          input.data_ptr(), static_cast<int64_t>(input.nbytes()), gathered.data_ptr(), what));
      return CallTorch(what, [&] {
        for (int m = 0; m < size(); ++m) outputs[0].push_back(gathered[m]);
      });
    }
    LOCKSTEP_RETURN_IF_ERROR(
        CheckInStep(Call{kAllGather, -1, static_cast<int64_t>(input.scalar_type()),
                         static_cast<int64_t>(input.nbytes())},
                    what));
    c10::intrusive_ptr<c10d::Work> work;
    const bool as_bytes = MovesAsBytes(input);
    LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] {
      std::vector<at::Tensor> inputs = {as_bytes ? BytesOf(input) : input};
      for (int m = 0; m < size(); ++m) outputs[0].push_back(at::empty_like(inputs[0]));
      work = group_->process_group->allgather(outputs, inputs);
    }));
    LOCKSTEP_RETURN_IF_ERROR(Wait(work, timeout(), what));
    if (!as_bytes) return absl::OkStatus();
    return CallTorch(what, [&] {
      for (at::Tensor& output : outputs[0]) {
        output = output.view(input.scalar_type()).reshape(input.sizes());
      }
    });
  });
  if (!status.ok()) return status;
  return std::move(outputs[0]);
}

absl::Status GlooCommunicator::AllReduceSum(at::Tensor& tensor) {
  const std::string what = What("all-reduce (sum)");
  return Collective("all-reduce (sum)", [&]() -> absl::Status {
    LOCKSTEP_RETURN_IF_ERROR(CheckTensor(tensor, what));
    if (TakesHostLane(group_->host_lane.get(), tensor) && tensor.scalar_type() != at::kBool) {
      // Every member gathers every contribution and adds them up in rank order, so all members
      // hold the same sum.
      LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor gathered, GatherOutput(tensor, size(), what));
      LOCKSTEP_RETURN_IF_ERROR(group_->host_lane->AllGather(
          tensor.data_ptr(), static_cast<int64_t>(tensor.nbytes()), gathered.data_ptr(), what));
      return CallTorch(what + ": adding up", [&] {
        at::Tensor sum = gathered[0].clone();
        for (int m = 1; m < size(); ++m) sum.add_(gathered[m]);
        tensor.copy_(sum);
      });
    }
    LOCKSTEP_RETURN_IF_ERROR(
        CheckInStep(Call{kAllReduce, -1, static_cast<int64_t>(tensor.scalar_type()),
                         static_cast<int64_t>(tensor.nbytes())},
                    what));
    c10::intrusive_ptr<c10d::Work> work;
    LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] {
      std::vector<at::Tensor> tensors = {tensor};
      c10d::AllreduceOptions options;
      options.reduceOp = c10d::ReduceOp::SUM;
      work = group_->process_group->allreduce(tensors, options);
    }));
    return Wait(work, timeout(), what);
  });
}

absl::Status GlooCommunicator::Barrier() {
  const std::string what = What("barrier");
  return Collective("barrier", [&]() -> absl::Status {
    LOCKSTEP_RETURN_IF_ERROR(CheckInStep(Call{kBarrier, -1, -1, 0}, what));
    c10::intrusive_ptr<c10d::Work> work;
    LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] { work = group_->process_group->barrier(); }));
    return Wait(work, timeout(), what);
  });
}

}  // namespace collectives
}  // namespace lockstep
