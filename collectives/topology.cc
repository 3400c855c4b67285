#include "collectives/topology.h"

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace collectives {

absl::StatusOr<Topology> Topology::Create(int world_size, int tp_size, int cp_size) {
  if (world_size <= 0 || tp_size <= 0 || cp_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", world_size, ", TP size ", tp_size,
                                                   " and CP size ", cp_size,
                                                   " must all be positive"));
  }
  if (world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", world_size,
                                                   " exceeds the largest supported world of ",
                                                   kMaxWorldSize, " ranks"));
  }
  // In 64 bits: tp * cp of two ints cannot overflow there (and would in 32).
  const int64_t replicas = int64_t{tp_size} * cp_size;
  if (world_size % replicas != 0) {
    return absl::InvalidArgumentError(absl::StrCat("TP size ", tp_size, " x CP size ", cp_size,
                                                   " = ", replicas,
                                                   " does not divide the world size ", world_size));
  }
  return Topology(static_cast<int>(world_size / replicas), tp_size, cp_size);
}

absl::StatusOr<Topology> Topology::CreateExact(int world_size, int dp_size, int tp_size,
                                               int cp_size) {
  if (dp_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("DP size ", dp_size, " must be positive"));
  }
  absl::StatusOr<Topology> topology = Create(world_size, tp_size, cp_size);
  if (!topology.ok()) return topology.status();
  if (topology->dp_size() != dp_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DP ", dp_size, " x TP ", tp_size, " x CP ", cp_size, " = ",
        int64_t{dp_size} * tp_size * cp_size, " ranks, but the world has ", world_size));
  }
  return topology;
}

absl::StatusOr<Coordinates> Topology::CoordinatesOf(int global_rank) const {
  if (global_rank < 0 || global_rank >= world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", global_rank, " is outside the world [0, ", world_size(), ") of ", DebugString()));
  }
  return CoordinatesInWorld(global_rank);
}

absl::StatusOr<int> Topology::GlobalRankOf(const Coordinates& c) const {
  if (c.dp < 0 || c.dp >= dp_size_ || c.cp < 0 || c.cp >= cp_size_ || c.tp < 0 ||
      c.tp >= tp_size_) {
    return absl::InvalidArgumentError(absl::StrCat("coordinates (dp ", c.dp, ", cp ", c.cp, ", tp ",
                                                   c.tp, ") are outside ", DebugString()));
  }
  return Rank(c.dp, c.cp, c.tp);
}

Coordinates Topology::CoordinatesInWorld(int global_rank) const {
  Coordinates c;
  c.tp = global_rank % tp_size_;
  c.cp = (global_rank / tp_size_) % cp_size_;
  c.dp = global_rank / (tp_size_ * cp_size_);
  return c;
}

std::vector<int> Topology::TpGroup(int global_rank) const {
  std::vector<int> group;
  if (!InWorld(global_rank)) return group;
  const Coordinates c = CoordinatesInWorld(global_rank);
  for (int tp = 0; tp < tp_size_; ++tp) group.push_back(Rank(c.dp, c.cp, tp));
  return group;
}

std::vector<int> Topology::CpGroup(int global_rank) const {
  std::vector<int> group;
  if (!InWorld(global_rank)) return group;
  const Coordinates c = CoordinatesInWorld(global_rank);
  for (int cp = 0; cp < cp_size_; ++cp) group.push_back(Rank(c.dp, cp, c.tp));
  return group;
}

std::vector<int> Topology::TpCpGroup(int global_rank) const {
  std::vector<int> group;
  if (!InWorld(global_rank)) return group;
  const Coordinates c = CoordinatesInWorld(global_rank);
  for (int cp = 0; cp < cp_size_; ++cp) {
    for (int tp = 0; tp < tp_size_; ++tp) group.push_back(Rank(c.dp, cp, tp));
  }
  return group;
}

std::vector<int> Topology::DpGroup(int global_rank) const {
  std::vector<int> group;
  if (!InWorld(global_rank)) return group;
  const Coordinates c = CoordinatesInWorld(global_rank);
  for (int dp = 0; dp < dp_size_; ++dp) group.push_back(Rank(dp, c.cp, c.tp));
  return group;
}

std::string Topology::DebugString() const {
  return absl::StrCat("DP", dp_size_, " x TP", tp_size_, " x CP", cp_size_);
}

}  // namespace collectives
}  // namespace lockstep
