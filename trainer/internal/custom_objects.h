// trainer/internal/custom_objects.h  (private to trainer/)
//
// The custom objects a trainer registers (TrainerRank::RegisterCustomObject): a loss head or any
// module the caller builds outside the model, whose parameters must be identical on every TP/CP
// replica. Registration is transactional across the group:
//   1. every replica registers the same name with the same metadata (agreement check);
//   2. the caller's RNG is synchronized, so the factories draw the same initial values;
//   3. each replica runs its factory; the group agrees on the outcome (Note [Outcome agreement]),
//      so a factory that fails on one replica fails the registration on all;
//   4. the group compares what the factories returned structurally — names, shapes, dtypes,
//      requires_grad, device types — so a replica whose factory built something else fails
//      every replica, naming the rank and the field, instead of being overwritten with bytes of
//      another shape;
//   5. the leader's values are broadcast into every replica's tensors, in place.
// Any failure registers nothing on any replica and puts the caller's RNG back where step 2 left
// it (the factory's draws undone). A name registered before returns the first object when the
// metadata is the same, and is refused (kAlreadyExists) when it is not.
//
// Thread-safety: one thread.

#ifndef LOCKSTEP_TRAINER_INTERNAL_CUSTOM_OBJECTS_H_
#define LOCKSTEP_TRAINER_INTERNAL_CUSTOM_OBJECTS_H_

#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "numerics/named_tensors.h"
#include "rng/rank_streams.h"
#include "trainer/trainer_config.h"

namespace lockstep {
namespace trainer {

namespace internal {

class CustomObjectRegistry {
 public:
  // Registers `name` as above. `group`: the TP x CP group (nullptr for a world of one);
  // `synchronize`: step 2 (the trainer's hand-back synchronization); `where`: error context.
  absl::StatusOr<numerics::NamedTensors> Register(collectives::Communicator* group,
                                                  rng::RankStreams& streams,
                                                  const std::function<absl::Status()>& synchronize,
                                                  const std::string& where, const std::string& name,
                                                  const std::string& metadata,
                                                  const CustomObjectFactory& factory);

 private:
  struct Entry {
    std::string metadata;
    numerics::NamedTensors tensors;
  };
  std::map<std::string, Entry> objects_;
};

// One line per tensor of `tensors`: "<index> '<name>' [d0, d1] <dtype> grad|no-grad <device>".
std::string DescribeStructure(const numerics::NamedTensors& tensors);

}  // namespace internal
}  // namespace trainer
}  // namespace lockstep

#endif  // LOCKSTEP_TRAINER_INTERNAL_CUSTOM_OBJECTS_H_
