#include "collectives/internal/group_registry.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/communicator.h"

namespace lockstep {
namespace collectives {
namespace internal {

absl::StatusOr<GroupRegistry::Entry> GroupRegistry::Register(absl::string_view backend,
                                                             absl::Span<const int> global_ranks,
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

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep
