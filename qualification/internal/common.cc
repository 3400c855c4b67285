#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "qualification/internal/checks.h"
#include "rng/synchronize.h"

namespace lockstep {
namespace qualification {
using collectives::Communicator;
using collectives::Topology;
namespace internal {

at::Tensor CallerDraws() {
  at::Tensor uniform = at::rand({16});
  at::Tensor dropout = at::dropout(at::ones({64}), 0.5, /*train=*/true);
  at::Tensor token_mask = at::randint(0, 2, {32}).to(at::kFloat);
  return at::cat({uniform, dropout, token_mask});
}

std::vector<int> DisagreeWithLeader(const Topology& topo, const std::vector<at::Tensor>& values) {
  std::vector<int> bad;
  for (int r = 0; r < topo.world_size(); ++r) {
    if (!at::equal(values[r], values[Topology::Leader(topo.TpCpGroup(r))])) bad.push_back(r);
  }
  return bad;
}

absl::Status Rewind(const RankSetup& setup) {
  if (!setup.synced.has_value()) return absl::FailedPreconditionError("the rank was not set up");
  return setup.synced->Restore();
}

std::string Ranks(const std::vector<int>& ranks) { return absl::StrJoin(ranks, ", "); }

}  // namespace internal

absl::StatusOr<RankSetup> SetUpRank(Communicator& world, const Topology& topology,
                                    NegativeControl control) {
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::RankGroups groups,
                            collectives::RankGroups::CreateBorrowing(world, topology));
  RankSetup setup(std::move(groups));
  setup.control = control;
  const int rank = world.rank();
  LOCKSTEP_ASSIGN_OR_RETURN(setup.streams,
                            rng::RankStreams::Create(rng::DefaultGenerators::CpuOnly()));
  // The caller's generators differ on every rank, as after independent data loading.
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("seeding the rank", [&] {
    at::manual_seed(1000 + rank);
    (void)at::rand({rank + 1});
  }));
  switch (control) {
    case NegativeControl::kNoSync:
      break;
    case NegativeControl::kWorldSync:
      LOCKSTEP_RETURN_IF_ERROR(rng::Synchronize(&world, *setup.streams));
      break;
    default:
      LOCKSTEP_RETURN_IF_ERROR(rng::Synchronize(setup.groups.tp_cp().get(), *setup.streams));
  }
  absl::StatusOr<rng::RngSnapshot> synced = rng::RngSnapshot::Capture(setup.streams->generators());
  if (!synced.ok()) return synced.status();
// GCC 12 at -O2 reports the optional CUDA state inside the moved snapshot as maybe-uninitialized
// (a false positive through StatusOr's storage; the value is initialized by Capture).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
  setup.synced.emplace(*synced);
#pragma GCC diagnostic pop
  return setup;
}

}  // namespace qualification
}  // namespace lockstep
