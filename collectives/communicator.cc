#include "collectives/communicator.h"

#include <cstdint>
#include <cstring>
#include <set>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"

namespace lockstep {
namespace collectives {

absl::StatusOr<int> Communicator::GlobalRank(int group_rank) const {
  if (group_rank < 0 || group_rank >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("group rank ", group_rank, " is outside [0, ", size(), ") of ", DebugName()));
  }
  return global_ranks()[group_rank];
}

absl::StatusOr<std::vector<at::Tensor>> Communicator::AllGatherThen(
    const at::Tensor& input,
    const std::function<absl::Status(const std::vector<at::Tensor>&)>& then) {
  absl::StatusOr<std::vector<at::Tensor>> gathered = AllGather(input);
  if (!gathered.ok()) return gathered;
  if (then) {
    if (absl::Status s = then(*gathered); !s.ok()) return s;
  }
  return gathered;
}

absl::Status BroadcastBytes(Communicator& comm, std::string* bytes, int root) {
  if (root < 0 || root >= comm.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is outside [0, ", comm.size(), ")"));
  }
  // Length first, so receivers can size their buffer.
  at::Tensor length;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("allocating the length buffer", [&] {
    length = at::empty({1}, at::kLong);
    length.data_ptr<int64_t>()[0] = static_cast<int64_t>(bytes->size());
  }));
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(comm.Broadcast(length, root),
                                        "while broadcasting the length of a byte string");
  const int64_t n = length.data_ptr<int64_t>()[0];
  if (n == 0) {
    bytes->clear();
    return absl::OkStatus();
  }
  at::Tensor payload;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("allocating the byte buffer", [&] {
    payload = at::empty({n}, at::kByte);
    if (comm.rank() == root) std::memcpy(payload.data_ptr(), bytes->data(), n);
  }));
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(comm.Broadcast(payload, root),
                                        absl::StrCat("while broadcasting ", n, " bytes"));
  if (comm.rank() != root) {
    bytes->assign(static_cast<const char*>(payload.data_ptr()), n);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ValidateGroupRanks(absl::Span<const int> global_ranks, int world_size,
                                       int my_global_rank) {
  if (global_ranks.empty()) return absl::InvalidArgumentError("a group needs at least one rank");
  std::set<int> seen;
  int mine = -1;
  for (int i = 0; i < static_cast<int>(global_ranks.size()); ++i) {
    const int r = global_ranks[i];
    if (r < 0 || r >= world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " in group ", FormatRanks(global_ranks),
                       " is outside the world [0, ", world_size, ")"));
    }
    if (!seen.insert(r).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " appears twice in group ", FormatRanks(global_ranks)));
    }
    if (r == my_global_rank) mine = i;
  }
  if (mine < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("global rank ", my_global_rank, " is not a member of group ",
                     FormatRanks(global_ranks), "; only members create a group"));
  }
  return mine;
}

std::string FormatRanks(absl::Span<const int> ranks) {
  return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
}

}  // namespace collectives
}  // namespace lockstep
