// collectives/internal/group_registry.h
//
// Private to collectives/: numbers the sub-groups one process creates per rank list, so that
// members that create groups of the same ranks in the same order meet under the same
// rendezvous key, whichever other groups each of them created in between.

#ifndef LOCKSTEP_COLLECTIVES_INTERNAL_GROUP_REGISTRY_H_
#define LOCKSTEP_COLLECTIVES_INTERNAL_GROUP_REGISTRY_H_

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "collectives/communicator.h"

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

  // Validates the rank list (ValidateGroupRanks) and numbers the new group. Thread-safe.
  absl::StatusOr<Entry> Register(absl::string_view backend, absl::Span<const int> global_ranks,
                                 int world_size, int my_global_rank) {
    absl::StatusOr<int> member = ValidateGroupRanks(global_ranks, world_size, my_global_rank);
    if (!member.ok()) return member.status();
    Entry entry;
    entry.global_ranks.assign(global_ranks.begin(), global_ranks.end());
    entry.member = *member;
    const std::string ranks = absl::StrJoin(global_ranks, ",");
    int ordinal = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ordinal = created_[absl::StrCat(backend, "/", ranks)]++;
    }
    entry.store_key = absl::StrCat("lockstep/", backend, "/group/", ranks, "/", ordinal);
    entry.name = absl::StrCat(backend, " group ", FormatRanks(global_ranks));
    if (ordinal > 0) absl::StrAppend(&entry.name, " #", ordinal);
    return entry;
  }

 private:
  std::mutex mu_;
  std::map<std::string, int> created_;  // "<backend>/<ranks>" -> groups created so far
};

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_INTERNAL_GROUP_REGISTRY_H_
