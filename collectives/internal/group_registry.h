// collectives/internal/group_registry.h
//
// Private to collectives/: numbers the sub-groups one process creates per rank list, so that
// members that create groups of the same ranks in the same order meet under the same
// rendezvous key, whichever other groups each of them created in between.
//
// Thread-safety: Register is thread-safe.

#ifndef LOCKSTEP_COLLECTIVES_INTERNAL_GROUP_REGISTRY_H_
#define LOCKSTEP_COLLECTIVES_INTERNAL_GROUP_REGISTRY_H_

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace lockstep {
namespace collectives {
namespace internal {

class GroupRegistry {
 public:
  struct Entry {
    std::vector<int> global_ranks;
    int member = 0;         // this process's rank in the group
    std::string store_key;  // "lockstep/<backend>/group/<ranks>/<ordinal>"
    std::string name;       // "<backend> group [0, 2]", with " #<ordinal>" after the first
  };

  // Validates the rank list (ValidateGroupRanks) and numbers the new group.
  absl::StatusOr<Entry> Register(absl::string_view backend, absl::Span<const int> global_ranks,
                                 int world_size, int my_global_rank);

 private:
  std::mutex mu_;
  std::map<std::string, int> created_;  // "<backend>/<ranks>" -> groups created so far
};

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_INTERNAL_GROUP_REGISTRY_H_
