// collectives/topology.h
//
// Topology lays a world of ranks out as data-parallel (DP) x tensor-parallel (TP) x
// context-parallel (CP) in Megatron's order: TP varies fastest, then CP, then DP:
//
//   global_rank = dp * (cp_size * tp_size) + cp * tp_size + tp
//
// so the TP x CP replicas of one DP worker are the contiguous block of tp_size * cp_size ranks.
// It answers, for any rank, its coordinates and the global ranks of its TP, CP, TP x CP and DP
// groups (each sorted ascending; the first member is the group's leader).
//
// Thread-safety: immutable after Create; safe to share.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(Topology topo, Topology::Create(/*world=*/8, /*tp=*/2, /*cp=*/2));
//   topo.dp_size();                 // 2
//   topo.TpCpGroup(5);              // [4, 5, 6, 7]
//   topo.Leader(topo.CpGroup(5));   // 5's CP peers are [5, 7]: leader 5

#ifndef LOCKSTEP_COLLECTIVES_TOPOLOGY_H_
#define LOCKSTEP_COLLECTIVES_TOPOLOGY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace lockstep {
namespace collectives {

// A rank's position in a Topology: its index along each dimension, each 0-based.
struct Coordinates {
  int dp = 0;  // the DP worker, in [0, dp_size)
  int cp = 0;  // the CP coordinate, in [0, cp_size)
  int tp = 0;  // the TP coordinate, in [0, tp_size)
  // Whether both name the same dp, cp and tp.
  bool operator==(const Coordinates& o) const { return dp == o.dp && cp == o.cp && tp == o.tp; }
};

// The largest world a Topology describes: 2^20 ranks. Every product of sizes is computed in 64
// bits, so no combination of valid int sizes overflows.
inline constexpr int kMaxWorldSize = 1 << 20;

// A world of ranks laid out DP x TP x CP in Megatron's order (see the top of this file).
class Topology {
 public:
  // A topology of `world_size` ranks with the given TP and CP sizes; DP is what remains.
  // kInvalidArgument when a size is not positive, the world exceeds kMaxWorldSize, or
  // tp_size * cp_size does not divide world_size (the message names the sizes).
  static absl::StatusOr<Topology> Create(int world_size, int tp_size, int cp_size);

  // As Create, with DP given too; kInvalidArgument unless dp * tp * cp == world_size.
  static absl::StatusOr<Topology> CreateExact(int world_size, int dp_size, int tp_size,
                                              int cp_size);

  // Number of ranks: dp_size * tp_size * cp_size.
  int world_size() const { return dp_size_ * tp_size_ * cp_size_; }
  // Number of DP workers (data-parallel size), >= 1.
  int dp_size() const { return dp_size_; }
  // Tensor-parallel size, >= 1.
  int tp_size() const { return tp_size_; }
  // Context-parallel size, >= 1.
  int cp_size() const { return cp_size_; }

  // The coordinates of `global_rank`; kInvalidArgument when the rank is outside the world.
  absl::StatusOr<Coordinates> CoordinatesOf(int global_rank) const;
  // The global rank at `coordinates`; kInvalidArgument when a coordinate is out of range.
  absl::StatusOr<int> GlobalRankOf(const Coordinates& coordinates) const;

  // Groups of `global_rank`, as sorted global ranks; empty for a rank outside the world (which
  // NewGroup and Leader refuse, so a bad rank surfaces as an error, never an abort).

  // The TP group: the tp_size ranks of the rank's DP worker with its CP coordinate.
  std::vector<int> TpGroup(int global_rank) const;
  // The CP group: the cp_size ranks of the rank's DP worker with its TP coordinate.
  std::vector<int> CpGroup(int global_rank) const;
  // The TP x CP group: the tp_size * cp_size ranks of the rank's DP worker (its replicas).
  std::vector<int> TpCpGroup(int global_rank) const;
  // The DP group: the dp_size ranks with the rank's CP and TP coordinates, one per DP worker.
  std::vector<int> DpGroup(int global_rank) const;

  // The leader of a group is its first (lowest) global rank; -1 for an empty group.
  static int Leader(absl::Span<const int> group) { return group.empty() ? -1 : group.front(); }

  // "DP2 x TP1 x CP2"
  std::string DebugString() const;

 private:
  Topology(int dp, int tp, int cp) : dp_size_(dp), tp_size_(tp), cp_size_(cp) {}
  bool InWorld(int global_rank) const { return global_rank >= 0 && global_rank < world_size(); }
  // Precondition: InWorld(global_rank).
  Coordinates CoordinatesInWorld(int global_rank) const;
  int Rank(int dp, int cp, int tp) const { return (dp * cp_size_ + cp) * tp_size_ + tp; }

  int dp_size_;
  int tp_size_;
  int cp_size_;
};

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_TOPOLOGY_H_
