// collectives/gloo_communicator.h
//
// GlooCommunicator implements Communicator over c10d's ProcessGroupGloo: CPU tensors always,
// and CUDA tensors where the LibTorch build has Gloo's CUDA support (the CUDA builds do). One
// Gloo context per group; sub-groups get their own context under a key of the rendezvous store
// derived from their rank list, so groups created in the same order by their members meet.
//
// Errors: every Gloo operation runs with the communicator's timeout; a peer that died surfaces
// as kUnavailable (its connection closed), a peer that does not arrive as kDeadlineExceeded.
// Either way the message names the operation and the group.
//
// Thread-safety: as Communicator (one thread per communicator at a time).
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(auto rendezvous, Rendezvous::FromEnvironment(absl::Seconds(60)));
//   LOCKSTEP_ASSIGN_OR_RETURN(auto world, GlooCommunicator::Create(rendezvous, {}));
//   LOCKSTEP_RETURN_IF_ERROR(world->AllReduceSum(gradient_norms));

#ifndef LOCKSTEP_COLLECTIVES_GLOO_COMMUNICATOR_H_
#define LOCKSTEP_COLLECTIVES_GLOO_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/rendezvous.h"

namespace lockstep {
namespace collectives {

class GlooCommunicator : public Communicator {
 public:
  struct Options {
    // How long a collective (and group creation) waits for peers. Default: 60 s.
    absl::Duration timeout = absl::Seconds(60);
    // Address for Gloo's transport to bind. Default: empty, meaning this host's name, falling
    // back to the loopback address when the name does not resolve.
    std::string hostname;
  };

  // The world communicator of the rendezvous's processes. Collective over every process.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(
      std::shared_ptr<Rendezvous> rendezvous, Options options);

  ~GlooCommunicator() override;

  int rank() const override;
  int size() const override;
  const std::vector<int>& global_ranks() const override;
  absl::Duration timeout() const override;
  std::string DebugName() const override;

  absl::Status Broadcast(at::Tensor& tensor, int root) override;
  absl::StatusOr<std::vector<at::Tensor>> AllGather(const at::Tensor& input) override;
  absl::Status AllReduceSum(at::Tensor& tensor) override;
  absl::Status Barrier() override;
  absl::StatusOr<std::unique_ptr<Communicator>> NewGroup(
      absl::Span<const int> global_ranks) override;

 private:
  struct Shared;
  struct Group;
  GlooCommunicator(std::shared_ptr<Shared> shared, std::unique_ptr<Group> group);

  std::shared_ptr<Shared> shared_;
  std::unique_ptr<Group> group_;
};

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_GLOO_COMMUNICATOR_H_
