#include "collectives/adopted_communicator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "collectives/internal/host_lane.h"
#include "collectives/internal/process_group_calls.h"
#include "collectives/internal/store.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

#if TORCH_VERSION_MAJOR >= 2
#include "torch/csrc/distributed/c10d/Backend.hpp"
#endif

namespace lockstep {
namespace collectives {

struct AdoptedCommunicator::Group {
  explicit Group(internal::ProcessGroupCalls c) : calls(std::move(c)) {}
  internal::ProcessGroupCalls calls;
  std::unique_ptr<internal::HostLane> host_lane;  // null: every tensor through the group
};

namespace {

// Small CPU tensors take the lane (see the top of adopted_communicator.h).
bool TakesHostLane(const internal::HostLane* lane, const at::Tensor& tensor) {
  return lane != nullptr && tensor.defined() && tensor.is_cpu() &&
         static_cast<int64_t>(tensor.nbytes()) <= internal::HostLane::kMaxBytes;
}

// What the lane compares besides the size: the operation built on its all-gather and the dtype,
// so that an all-reduce and an all-gather, or two dtypes, are refused as different collectives.
enum LaneOperation : uint32_t { kLaneAllGather = 1, kLaneAllReduce = 2, kLaneBroadcast = 3 };
uint32_t LaneTag(LaneOperation op, const at::Tensor& tensor) {
  return (static_cast<uint32_t>(op) << 16) | static_cast<uint32_t>(tensor.scalar_type());
}

// Note [Lane or group] (host_lane.h): a CPU tensor that does not take the lane is announced on
// it first, so that members split between the lane and the group are refused, not stranded.
absl::Status AnnounceOffTheLane(internal::HostLane* lane, LaneOperation op,
                                const at::Tensor& tensor, const std::string& what) {
  if (lane == nullptr || !tensor.defined() || !tensor.is_cpu()) {
    return absl::OkStatus();
  }
  return lane->Announce(static_cast<int64_t>(tensor.nbytes()), what, LaneTag(op, tensor));
}

// Every member's `input` through the lane, as [size, input.sizes()...].
absl::StatusOr<at::Tensor> LaneGather(internal::HostLane& lane, const at::Tensor& input, int size,
                                      uint32_t tag, const std::string& what) {
  at::Tensor gathered;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(what + ": allocating the output", [&] {
    std::vector<int64_t> shape = {size};
    for (int64_t d : input.sizes()) shape.push_back(d);
    gathered = at::empty(shape, input.options());
  }));
  LOCKSTEP_RETURN_IF_ERROR(lane.AllGather(input.data_ptr(), static_cast<int64_t>(input.nbytes()),
                                          gathered.data_ptr(), what, tag));
  return gathered;
}

// The lane of the group's members, met in `store` under `key`.
absl::StatusOr<std::unique_ptr<internal::HostLane>> ConnectLane(
    c10::intrusive_ptr<c10d::Store> store, const std::string& key, int global_rank, int rank,
    int size, int world_size, absl::Duration timeout, const std::string& what) {
  auto impl = std::make_unique<Rendezvous::Impl>();
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] {
    impl->store = c10::make_intrusive<c10d::PrefixStore>("lockstep", std::move(store));
  }));
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::shared_ptr<Rendezvous> rendezvous,
      Rendezvous::OverStore(std::move(impl), global_rank, world_size, timeout));
  return internal::HostLane::Connect(*rendezvous, key, rank, size, timeout);
}

}  // namespace

AdoptedCommunicator::AdoptedCommunicator(std::shared_ptr<internal::WorldState> world,
                                         internal::GroupIdentity identity,
                                         std::unique_ptr<Group> group)
    : CommunicatorBase(std::move(world), std::move(identity)), group_(std::move(group)) {}

AdoptedCommunicator::~AdoptedCommunicator() = default;

absl::StatusOr<std::unique_ptr<AdoptedCommunicator>> AdoptedCommunicator::Adopt(
    c10::intrusive_ptr<C10dGroup> group, Options options) {
  if (!group) return absl::InvalidArgumentError("adopting a group: the group is null");
  LOCKSTEP_RETURN_IF_ERROR(internal::ValidateTimeout(options.timeout));
  const int size = group->getSize();
  const int rank = group->getRank();
  const std::string what = absl::StrCat("adopting a ", options.backend, " group of ", size,
                                        " members as ", FormatRanks(options.global_ranks));
  if (static_cast<int>(options.global_ranks.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the list has ", options.global_ranks.size(), " ranks, the group ", size));
  }
  if (options.world_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": world size ", options.world_size, " <= 0"));
  }
  LOCKSTEP_RETURN_IF_ERROR(
      ValidateGroupRanks(options.global_ranks, options.world_size, options.global_ranks.at(rank))
          .status());
  if (options.staging_device.has_value() && !options.staging_device->is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the staging device is ", options.staging_device->str(), ", not a CUDA device"));
  }
  if (options.store && options.lane_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the host lane's key is empty"));
  }
  LOCKSTEP_RETURN_IF_ERROR(internal::IgnoreSigpipeAtDefault());
  auto world =
      std::make_shared<internal::WorldState>(options.backend, options.world_size, options.timeout);
  internal::GroupIdentity identity;
  identity.global_ranks = options.global_ranks;
  identity.rank = rank;
  identity.name =
      absl::StrCat("adopted ", options.backend, " group ", FormatRanks(identity.global_ranks));
  auto adopted = std::make_unique<Group>(internal::ProcessGroupCalls(
      std::move(group), options.global_ranks, options.staging_device, options.timeout));
  if (options.store) {
    LOCKSTEP_ASSIGN_OR_RETURN(
        adopted->host_lane,
        ConnectLane(std::move(options.store), options.lane_key, options.global_ranks.at(rank), rank,
                    size, options.world_size, options.timeout, what));
  }
  return std::unique_ptr<AdoptedCommunicator>(
      new AdoptedCommunicator(std::move(world), std::move(identity), std::move(adopted)));
}

bool AdoptedCommunicator::has_host_lane() const { return group_->host_lane != nullptr; }

absl::StatusOr<std::unique_ptr<Communicator>> AdoptedCommunicator::CreateGroup(
    internal::GroupIdentity) {
  return absl::FailedPreconditionError(
      absl::StrCat("creating a group from ", DebugName(),
                   ": an adopted group makes no sub-groups; create it with the program's own "
                   "library (torch.distributed.new_group) and adopt it"));
}

absl::Status AdoptedCommunicator::Broadcast(at::Tensor& tensor, int root) {
  const std::string op = absl::StrCat("broadcast from group rank ", root);
  const std::string what = What(op);
  return Collective(op, [&]() -> absl::Status {
    if (!TakesHostLane(group_->host_lane.get(), tensor)) {
      LOCKSTEP_RETURN_IF_ERROR(
          AnnounceOffTheLane(group_->host_lane.get(), kLaneBroadcast, tensor, what));
      return group_->calls.Broadcast(tensor, root, what);
    }
    LOCKSTEP_RETURN_IF_ERROR(internal::CheckContiguous(tensor, what));
    return group_->host_lane->Broadcast(tensor.data_ptr(), static_cast<int64_t>(tensor.nbytes()),
                                        root, what);
  });
}

absl::StatusOr<std::vector<at::Tensor>> AdoptedCommunicator::AllGather(const at::Tensor& input) {
  const std::string what = What("all-gather");
  std::vector<at::Tensor> outputs;
  absl::Status status = Collective("all-gather", [&]() -> absl::Status {
    if (!TakesHostLane(group_->host_lane.get(), input)) {
      LOCKSTEP_RETURN_IF_ERROR(
          AnnounceOffTheLane(group_->host_lane.get(), kLaneAllGather, input, what));
      LOCKSTEP_ASSIGN_OR_RETURN(outputs, group_->calls.AllGather(input, what));
      return absl::OkStatus();
    }
    LOCKSTEP_RETURN_IF_ERROR(internal::CheckContiguous(input, what));
    LOCKSTEP_ASSIGN_OR_RETURN(
        at::Tensor gathered,
        LaneGather(*group_->host_lane, input, size(), LaneTag(kLaneAllGather, input), what));
    return CallTorch(what, [&] {
      for (int m = 0; m < size(); ++m) outputs.push_back(gathered[m]);
    });
  });
  if (!status.ok()) return status;
  return outputs;
}

absl::Status AdoptedCommunicator::AllReduceSum(at::Tensor& tensor) {
  const std::string what = What("all-reduce (sum)");
  return Collective("all-reduce (sum)", [&]() -> absl::Status {
    if (!TakesHostLane(group_->host_lane.get(), tensor) || tensor.scalar_type() == at::kBool) {
      LOCKSTEP_RETURN_IF_ERROR(
          AnnounceOffTheLane(group_->host_lane.get(), kLaneAllReduce, tensor, what));
      return group_->calls.AllReduceSum(tensor, what);
    }
    // Every member gathers every contribution and adds them up in rank order, so all members
    // hold the same sum.
    LOCKSTEP_RETURN_IF_ERROR(internal::CheckContiguous(tensor, what));
    LOCKSTEP_ASSIGN_OR_RETURN(
        at::Tensor gathered,
        LaneGather(*group_->host_lane, tensor, size(), LaneTag(kLaneAllReduce, tensor), what));
    return CallTorch(what + ": adding up", [&] {
      at::Tensor sum = gathered[0].clone();
      for (int m = 1; m < size(); ++m) sum.add_(gathered[m]);
      tensor.copy_(sum);
    });
  });
}

absl::Status AdoptedCommunicator::Barrier() {
  return Collective("barrier", [&] { return group_->calls.Barrier(What("barrier")); });
}

}  // namespace collectives
}  // namespace lockstep
