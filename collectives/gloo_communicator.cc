#include "collectives/gloo_communicator.h"

#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/internal/group_registry.h"
#include "collectives/internal/store.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"

namespace lockstep {
namespace collectives {

// State shared by a world communicator and every group made from it.
struct GlooCommunicator::Shared {
  std::shared_ptr<Rendezvous> rendezvous;
  Options options;
  std::shared_ptr<::gloo::transport::Device> device;
  internal::GroupRegistry groups;
};

struct GlooCommunicator::Group {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> process_group;
  std::vector<int> global_ranks;
  int rank = 0;
  std::string name;
};

GlooCommunicator::GlooCommunicator(std::shared_ptr<Shared> shared, std::unique_ptr<Group> group)
    : shared_(std::move(shared)), group_(std::move(group)) {}

GlooCommunicator::~GlooCommunicator() = default;

int GlooCommunicator::rank() const { return group_->rank; }
int GlooCommunicator::size() const { return static_cast<int>(group_->global_ranks.size()); }
const std::vector<int>& GlooCommunicator::global_ranks() const { return group_->global_ranks; }
absl::Duration GlooCommunicator::timeout() const { return shared_->options.timeout; }
std::string GlooCommunicator::DebugName() const { return group_->name; }

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    std::shared_ptr<Rendezvous> rendezvous, Options options) {
  if (rendezvous == nullptr) return absl::InvalidArgumentError("rendezvous is null");
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout ", absl::FormatDuration(options.timeout), " must be positive"));
  }
  auto shared = std::make_shared<Shared>();
  shared->rendezvous = rendezvous;
  shared->options = options;
  auto group = std::make_unique<Group>();
  group->rank = rendezvous->rank();
  for (int r = 0; r < rendezvous->world_size(); ++r) group->global_ranks.push_back(r);
  group->name = absl::StrCat("gloo world ", FormatRanks(group->global_ranks));
  absl::Status status =
      internal::RunComm(absl::StrCat("creating ", group->name, " as rank ", group->rank), [&] {
        shared->device = options.hostname.empty()
                             ? c10d::ProcessGroupGloo::createDefaultDevice()
                             : c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname);
        auto pg_options =
            c10d::ProcessGroupGloo::Options::create(internal::ToChrono(options.timeout));
        pg_options->devices = {shared->device};
        auto store =
            c10::make_intrusive<c10d::PrefixStore>("lockstep/world", rendezvous->impl().store);
        group->process_group = c10::make_intrusive<c10d::ProcessGroupGloo>(
            store, group->rank, rendezvous->world_size(), pg_options);
      });
  if (!status.ok()) return status;
  return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(shared, std::move(group)));
}

namespace {

// Waits for `work`, converting failures into statuses. Gloo applies the timeout inside the
// operation; the wait's own bound is a backstop a little past it.
absl::Status Wait(const c10::intrusive_ptr<c10d::Work>& work, absl::Duration timeout,
                  const std::string& what) {
  return internal::RunComm(what, [&] {
    if (!work->wait(internal::ToChrono(timeout + absl::Seconds(5)))) {
      throw std::runtime_error("timed out waiting for the operation");
    }
  });
}

absl::Status CheckTensor(const at::Tensor& tensor, const std::string& what) {
  if (!tensor.defined()) return absl::InvalidArgumentError(what + ": tensor is undefined");
  if (!tensor.is_contiguous()) {
    return absl::InvalidArgumentError(what + ": tensor must be contiguous");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GlooCommunicator::Broadcast(at::Tensor& tensor, int root) {
  const std::string what = absl::StrCat("broadcast from group rank ", root, " on ", DebugName());
  if (root < 0 || root >= size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": root is outside [0, ", size(), ")"));
  }
  absl::Status valid = CheckTensor(tensor, what);
  if (!valid.ok()) return valid;
  c10::intrusive_ptr<c10d::Work> work;
  absl::Status status = internal::RunComm(what, [&] {
    std::vector<at::Tensor> tensors = {tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    options.rootTensor = 0;
    work = group_->process_group->broadcast(tensors, options);
  });
  if (!status.ok()) return status;
  return Wait(work, timeout(), what);
}

absl::StatusOr<std::vector<at::Tensor>> GlooCommunicator::AllGather(const at::Tensor& input) {
  const std::string what = absl::StrCat("all-gather on ", DebugName());
  absl::Status valid = CheckTensor(input, what);
  if (!valid.ok()) return valid;
  std::vector<std::vector<at::Tensor>> outputs(1);
  c10::intrusive_ptr<c10d::Work> work;
  absl::Status status = internal::RunComm(what, [&] {
    for (int m = 0; m < size(); ++m) outputs[0].push_back(at::empty_like(input));
    std::vector<at::Tensor> inputs = {input};
    work = group_->process_group->allgather(outputs, inputs);
  });
  if (!status.ok()) return status;
  status = Wait(work, timeout(), what);
  if (!status.ok()) return status;
  return std::move(outputs[0]);
}

absl::Status GlooCommunicator::AllReduceSum(at::Tensor& tensor) {
  const std::string what = absl::StrCat("all-reduce (sum) on ", DebugName());
  absl::Status valid = CheckTensor(tensor, what);
  if (!valid.ok()) return valid;
  c10::intrusive_ptr<c10d::Work> work;
  absl::Status status = internal::RunComm(what, [&] {
    std::vector<at::Tensor> tensors = {tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    work = group_->process_group->allreduce(tensors, options);
  });
  if (!status.ok()) return status;
  return Wait(work, timeout(), what);
}

absl::Status GlooCommunicator::Barrier() {
  const std::string what = absl::StrCat("barrier on ", DebugName());
  c10::intrusive_ptr<c10d::Work> work;
  absl::Status status = internal::RunComm(what, [&] { work = group_->process_group->barrier(); });
  if (!status.ok()) return status;
  return Wait(work, timeout(), what);
}

absl::StatusOr<std::unique_ptr<Communicator>> GlooCommunicator::NewGroup(
    absl::Span<const int> global_ranks) {
  absl::StatusOr<internal::GroupRegistry::Entry> entry = shared_->groups.Register(
      "gloo", global_ranks, shared_->rendezvous->world_size(), group_->global_ranks[group_->rank]);
  if (!entry.ok()) return entry.status();
  auto group = std::make_unique<Group>();
  group->global_ranks = entry->global_ranks;
  group->rank = entry->member;
  group->name = entry->name;
  absl::Status status = internal::RunComm(
      absl::StrCat("creating ", group->name, " (members must create it together)"), [&] {
        auto pg_options = c10d::ProcessGroupGloo::Options::create(internal::ToChrono(timeout()));
        pg_options->devices = {shared_->device};
        auto store = c10::make_intrusive<c10d::PrefixStore>(entry->store_key,
                                                            shared_->rendezvous->impl().store);
        group->process_group = c10::make_intrusive<c10d::ProcessGroupGloo>(
            store, group->rank, static_cast<int>(group->global_ranks.size()), pg_options);
      });
  if (!status.ok()) return status;
  return std::unique_ptr<Communicator>(new GlooCommunicator(shared_, std::move(group)));
}

}  // namespace collectives
}  // namespace lockstep
