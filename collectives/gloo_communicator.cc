#include "collectives/gloo_communicator.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "collectives/internal/process_group_calls.h"
#include "collectives/internal/store.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"

namespace lockstep {
namespace collectives {

namespace internal {

struct GlooTransport {
  std::shared_ptr<::gloo::transport::Device> device;
  absl::Duration engine_timeout;  // Gloo's own, inside each operation
};

struct GlooGroup {
  // The process group of `identity` over `transport` (Note [Transport and group]).
  static absl::StatusOr<std::unique_ptr<GlooGroup>> Create(const GlooTransport& transport,
                                                           const WorldState& world,
                                                           const GroupIdentity& identity,
                                                           absl::Duration timeout);

  explicit GlooGroup(ProcessGroupCalls c) : calls(std::move(c)) {}
  ProcessGroupCalls calls;  // Gloo takes CPU and CUDA tensors itself: no staging
};

}  // namespace internal

namespace {

// A process group over `identity`'s members, meeting under its store key. A failure to connect
// (a member gone, or the link to its host down) names the members that did not answer the roll
// call (Note [Roll call]): Gloo's own error names only a socket address.
absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroupGloo>> MakeProcessGroup(
    const internal::WorldState& world, const internal::GroupIdentity& identity,
    const std::shared_ptr<::gloo::transport::Device>& device, absl::Duration timeout) {
  // `timeout` here is Gloo's own (Options::engine_timeout, else the communicator's).
  c10::intrusive_ptr<c10d::ProcessGroupGloo> process_group;
  absl::Status status =
      CallTorch(absl::StrCat("creating ", identity.name, " as its rank ", identity.rank), [&] {
        auto options = c10d::ProcessGroupGloo::Options::create(internal::ToChrono(timeout));
        options->devices = {device};
        auto store = c10::make_intrusive<c10d::PrefixStore>(identity.store_key,
                                                            world.rendezvous->impl().store);
        process_group = c10::make_intrusive<c10d::ProcessGroupGloo>(
            store, identity.rank, static_cast<int>(identity.global_ranks.size()), options);
      });
  // A store's wait timeout arrives as a plain c10::Error (kInternal) from LibTorch versions
  // without c10::DistError, so every failure but a bad argument or memory gets the roll call.
  if (!status.ok() && status.code() != absl::StatusCode::kInvalidArgument &&
      status.code() != absl::StatusCode::kResourceExhausted) {
    return internal::RollCall(world, identity, "create", std::move(status));
  }
  if (!status.ok()) return status;
  return process_group;
}

}  // namespace

absl::StatusOr<std::unique_ptr<internal::GlooGroup>> internal::GlooGroup::Create(
    const GlooTransport& transport, const WorldState& world, const GroupIdentity& identity,
    absl::Duration timeout) {
  LOCKSTEP_ASSIGN_OR_RETURN(
      c10::intrusive_ptr<c10d::ProcessGroupGloo> process_group,
      MakeProcessGroup(world, identity, transport.device, transport.engine_timeout));
  return std::make_unique<GlooGroup>(
      ProcessGroupCalls(std::move(process_group), identity.global_ranks, std::nullopt, timeout));
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<internal::WorldState> world,
                                   internal::GroupIdentity identity,
                                   std::shared_ptr<internal::GlooTransport> transport,
                                   std::unique_ptr<internal::GlooGroup> group)
    : TransportCommunicator(std::move(world), std::move(identity), std::move(transport),
                            std::move(group)) {}

GlooCommunicator::~GlooCommunicator() = default;

namespace {

// The local IPv4 address a datagram to host:port would leave from (no packet is sent), or ""
// when the store is on the loopback address, is not IPv4 or has no route (Note [Gloo's address]).
std::string LocalAddressTowards(const std::string& host, int port) {
  if (host.empty() || port <= 0) return "";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return "";
  std::string address;
  const auto* target = reinterpret_cast<const sockaddr_in*>(found->ai_addr);
  const bool loopback = (ntohl(target->sin_addr.s_addr) >> 24) == 127;
  const int fd = loopback ? -1 : socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    sockaddr_in local{};
    socklen_t length = sizeof(local);
    char text[INET_ADDRSTRLEN] = {};
    if (connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr) {
      address = text;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return address;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    std::shared_ptr<Rendezvous> rendezvous, Options options) {
  LOCKSTEP_RETURN_IF_ERROR(internal::IgnoreSigpipeAtDefault());
  LOCKSTEP_ASSIGN_OR_RETURN(internal::NewWorld world,
                            internal::StartWorld("gloo", rendezvous, options.timeout));
  auto transport = std::make_shared<internal::GlooTransport>();
  transport->engine_timeout =
      options.engine_timeout > absl::ZeroDuration() ? options.engine_timeout : options.timeout;
  // Note [Gloo's address]: which local address peers reach this rank at. The host's name is
  // what c10d's default device binds, but on a node whose name does not resolve (a container, a
  // namespaced host) it falls back to the loopback address, which no other host can reach. So,
  // unless told (Options::hostname, or GLOO_SOCKET_IFNAME as in PyTorch), a rank of a TCP
  // rendezvous whose store is not on the loopback address binds the local address its route to
  // the store leaves from: the interface the job's hosts share.
  std::string address = options.hostname;
  const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
  if (address.empty() && (interface == nullptr || *interface == '\0')) {
    address = LocalAddressTowards(rendezvous->store_host(), rendezvous->store_port());
  }
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("creating Gloo's transport device", [&] {
    if (!address.empty()) {
      transport->device = c10d::ProcessGroupGloo::createDeviceForHostname(address);
    } else if (interface != nullptr && *interface != '\0') {
      transport->device = c10d::ProcessGroupGloo::createDeviceForInterface(interface);
    } else {
      transport->device = c10d::ProcessGroupGloo::createDefaultDevice();
    }
  }));
  return CreateWorld(std::move(world), std::move(transport), options.timeout);
}

absl::Status GlooCommunicator::Broadcast(at::Tensor& tensor, int root) {
  const std::string op = absl::StrCat("broadcast from group rank ", root);
  return Collective(op, [&] { return group().calls.Broadcast(tensor, root, What(op)); });
}

absl::StatusOr<std::vector<at::Tensor>> GlooCommunicator::AllGather(const at::Tensor& input) {
  std::vector<at::Tensor> outputs;
  absl::Status status = Collective("all-gather", [&]() -> absl::Status {
    LOCKSTEP_ASSIGN_OR_RETURN(outputs, group().calls.AllGather(input, What("all-gather")));
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return outputs;
}

absl::Status GlooCommunicator::AllReduceSum(at::Tensor& tensor) {
  return Collective("all-reduce (sum)",
                    [&] { return group().calls.AllReduceSum(tensor, What("all-reduce (sum)")); });
}

absl::Status GlooCommunicator::Barrier() {
  return Collective("barrier", [&] { return group().calls.Barrier(What("barrier")); });
}

}  // namespace collectives
}  // namespace lockstep
