#include "qualification/internal/row_owners.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "planner/planner.h"

namespace lockstep {
namespace qualification {
namespace internal {

at::Tensor RowsDigest(const at::Tensor& rows) {
  const at::Tensor host = rows.detach().to(at::kCPU).contiguous();
  const Sha256Digest digest =
      Sha256Framed({std::string(static_cast<const char*>(host.data_ptr()), host.nbytes())});
  at::Tensor t = at::empty({static_cast<int64_t>(digest.size())}, at::kByte);
  std::memcpy(t.data_ptr<uint8_t>(), digest.data(), digest.size());
  return t;
}

trainer::ForwardAdapter RowOwnership::Wrap(trainer::ForwardAdapter forward) {
  return [this, forward = std::move(forward)](
             const trainer::ShardWork& work) -> absl::StatusOr<at::Tensor> {
    LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor out, forward(work));
    ComputedShard shard;
    shard.microbatch = work.microbatch;
    for (int c = 0; c < work.cp_size; ++c) {
      LOCKSTEP_ASSIGN_OR_RETURN(std::vector<int64_t> rows,
                                planner::ShardTokenIndices(*work.plan, work.microbatch, c));
      shard.rows_by_cp.push_back(std::move(rows));
    }
    const int64_t mine = static_cast<int64_t>(shard.rows_by_cp[work.cp_rank].size());
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("digesting the shard's rows",
                                       [&] { shard.own = RowsDigest(out.narrow(0, 0, mine)); }));
    computed_.push_back(std::move(shard));
    return out;
  };
}

absl::Status RowOwnership::Received(const trainer::MicrobatchOutput& out) {
  if (computed_.empty() || computed_.front().microbatch != out.microbatch) {
    return absl::InternalError(
        absl::StrCat("microbatch ", out.microbatch, " was handed back without its forward call"));
  }
  const ComputedShard shard = std::move(computed_.front());
  computed_.pop_front();
  return CallTorch("digesting the received rows", [&] {
    std::vector<at::Tensor> digests = {shard.own};
    for (const std::vector<int64_t>& rows : shard.rows_by_cp) {
      const at::Tensor index = at::tensor(rows, at::kLong).to(out.outputs.device());
      digests.push_back(RowsDigest(out.outputs.index_select(0, index)));
    }
    digests_.push_back(at::cat(digests));
  });
}

absl::StatusOr<std::string> RowsDisagreeWithOwners(collectives::Communicator* group,
                                                   const collectives::Topology& topology,
                                                   const std::vector<at::Tensor>& digests) {
  if (group == nullptr || digests.empty()) return std::string();
  at::Tensor mine;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("joining the row digests", [&] { mine = at::cat(digests); }));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> all, group->AllGather(mine));
  std::vector<int> cp_of;
  for (int global : group->global_ranks()) {
    LOCKSTEP_ASSIGN_OR_RETURN(collectives::Coordinates c, topology.CoordinatesOf(global));
    cp_of.push_back(c.cp);
  }
  constexpr int64_t kDigest = 32;
  const int64_t per = digests.front().numel();  // (1 + cp_size) digests per hand-back
  auto digest = [&](int member, size_t hand_back, int64_t slot) {
    return all[member].narrow(0, static_cast<int64_t>(hand_back) * per + slot * kDigest, kDigest);
  };
  for (size_t i = 0; i < digests.size(); ++i) {
    for (int k = 0; k < group->size(); ++k) {
      for (int j = 0; j < group->size(); ++j) {
        if (cp_of[j] == cp_of[k] && !at::equal(digest(k, i, 0), digest(j, i, 0))) {
          return absl::StrCat("hand-back ", i, ": the TP replicas of CP rank ", cp_of[k],
                              " (group ranks ", j, " and ", k, ") computed different rows");
        }
      }
      for (int m = 0; m < group->size(); ++m) {
        if (!at::equal(digest(m, i, 1 + cp_of[k]), digest(k, i, 0))) {
          return absl::StrCat("hand-back ", i, ": group rank ", m, " received CP rank ", cp_of[k],
                              "'s rows other than group rank ", k, " computed them");
        }
      }
    }
  }
  return std::string();
}

}  // namespace internal
}  // namespace qualification
}  // namespace lockstep
