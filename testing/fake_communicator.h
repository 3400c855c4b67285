// testing/fake_communicator.h
//
// FakeWorld: an in-process world of N ranks, each a thread holding a FakeCommunicator, for unit
// tests of logic that talks through collectives::Communicator. Collectives really exchange
// tensors between the threads (deterministically: sums are taken in group-rank order), and the
// world can inject the faults that real jobs meet:
//   - a rank that fails: its call number k returns kAborted and the rank is dead from then on;
//     peers waiting for it get kUnavailable naming it;
//   - a rank that is late: it sleeps before its call number k, so peers time out
//     (kDeadlineExceeded, naming the ranks that did not arrive) when the delay exceeds the
//     timeout;
//   - a rank that calls a different collective, or the same one with different arguments: every
//     member of that call gets kFailedPrecondition naming each rank and what it called.
// As with every Communicator, a fake communicator is unusable after its first error.
//
// Thread-safety: FakeWorld is thread-safe; each FakeCommunicator is used by one thread.
//
// Example:
//   collectives::FakeWorld world(
//       4, collectives::FakeWorld::Options::Of(absl::Seconds(2)));
//   world.InjectFailure(/*rank=*/3, /*call_index=*/0);
//   std::vector<absl::Status> results = world.Run([](collectives::Communicator& comm) {
//     return comm.Barrier();
//   });  // ranks 0..2: kUnavailable naming rank 3; rank 3: kAborted

#ifndef LOCKSTEP_TESTING_FAKE_COMMUNICATOR_H_
#define LOCKSTEP_TESTING_FAKE_COMMUNICATOR_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/internal/communicator_base.h"

namespace lockstep {
namespace collectives {

class FakeWorld {
 public:
  struct Options {
    // Options whose collectives wait `timeout` for their peers.
    static Options Of(absl::Duration timeout) {
      Options options;
      options.timeout = timeout;
      return options;
    }
    // How long a collective waits for its peers. Default: 10 s.
    absl::Duration timeout = absl::Seconds(10);
  };

  explicit FakeWorld(int world_size, Options options);
  explicit FakeWorld(int world_size) : FakeWorld(world_size, Options()) {}
  FakeWorld(const FakeWorld&) = delete;
  FakeWorld& operator=(const FakeWorld&) = delete;

  int world_size() const { return world_size_; }

  // The world communicator of `rank`. Precondition: 0 <= rank < world_size(); call once per rank.
  std::unique_ptr<collectives::Communicator> Communicator(int rank);

  // Rank `rank` fails at its collective call number `call_index` (counting every collective
  // it makes on any of its communicators, from 0): that call returns kAborted, later calls too.
  void InjectFailure(int rank, int call_index);
  // Rank `rank` sleeps for `delay` before its collective call number `call_index`.
  void InjectDelay(int rank, int call_index, absl::Duration delay);
  // Rank `rank` runs `substitute` instead of its collective call number `call_index` (e.g. an
  // all-reduce where its peers broadcast); the substitute gets the rank's communicator.
  void InjectSubstitute(int rank, int call_index,
                        std::function<absl::Status(collectives::Communicator&)> substitute);

  // Runs `body` on one thread per rank with that rank's world communicator and returns each
  // rank's status, indexed by rank.
  std::vector<absl::Status> Run(std::function<absl::Status(collectives::Communicator&)> body);

  // How many collectives completed on any group (for tests of the fake itself).
  int completed_collectives() const;

 private:
  friend class FakeCommunicator;
  struct Call;
  struct Slot;
  struct Fault;

  // Runs one collective for `member` of `group`: deposits `call`, waits for the others, and
  // returns this member's output tensors (empty for broadcast/all-reduce, which write in place).
  absl::Status Collective(const std::vector<int>& group, int member, Call call,
                          std::vector<at::Tensor>* outputs);
  absl::Status ApplyFaults(int global_rank, bool* substituted,
                           std::function<absl::Status(collectives::Communicator&)>* substitute);

  const int world_size_;
  const Options options_;
  mutable absl::Mutex mu_;
  std::map<std::pair<std::vector<int>, int64_t>, std::shared_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
  std::map<std::vector<int>, std::vector<int64_t>> next_call_ ABSL_GUARDED_BY(mu_);
  std::vector<int> calls_made_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> dead_ ABSL_GUARDED_BY(mu_);
  std::multimap<std::pair<int, int>, std::shared_ptr<Fault>> faults_ ABSL_GUARDED_BY(mu_);
  int completed_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<internal::WorldState> state_;
};

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_TESTING_FAKE_COMMUNICATOR_H_
