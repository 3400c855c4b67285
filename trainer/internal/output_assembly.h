// trainer/internal/output_assembly.h  (private to trainer/)
//
// The full outputs of a microbatch on every TP/CP replica: each member sends its shard's outputs
// padded to the widest shard (an empty shard sends padding, so every member runs the same
// all-gather), and each member assembles the microbatch's rows in packed order — this rank's own
// rows from its forward output (differentiable into the model), the other ranks' rows from the
// gathered shards (constants).
//
// Few pieces (long sequences): the output is filled run by run, this rank's own runs while the
// all-gather runs (on a GPU on a side stream that waits for the forward), the others' queued as
// soon as the all-gather is (Communicator::AllGatherThen), and the output handed back is one
// autograd node (AssembledOutputs) whose backward gives the forward output its own rows'
// gradient. Many pieces (short sequences): one index_select over a listed index, with the own
// rows put back by index_copy. Either way the forward output stays in the graph even for an empty
// shard, so every rank's backward runs the same blocks and their collectives.
//
// Thread-safety: as TrainerRank's (one thread).

#ifndef LOCKSTEP_TRAINER_INTERNAL_OUTPUT_ASSEMBLY_H_
#define LOCKSTEP_TRAINER_INTERNAL_OUTPUT_ASSEMBLY_H_

#include <cstdint>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "planner/plan.pb.h"
#include "planner/planner.h"

namespace lockstep {
namespace trainer {
namespace internal {

// One microbatch's shards, as the assembly needs them.
struct ShardLayout {
  const planner::Microbatch* microbatch = nullptr;
  // By CP rank: its pieces of the microbatch.
  std::vector<std::vector<planner::ShardPiece>> pieces;
  int cp_rank = 0;
  // By CP rank: the group rank of its first member, whose gathered shard is read (TP replicas of
  // a CP rank hold the same rows).
  const std::vector<int>* cp_holders = nullptr;
  // The most tokens any CP rank holds.
  int64_t widest = 0;
};

class OutputAssembly {
 public:
  // Gathers `local` (this rank's forward output for its shard) over `group` and returns the
  // microbatch's full outputs in packed order. Errors name `where` and the step that failed.
  absl::StatusOr<at::Tensor> Gather(collectives::Communicator& group, const ShardLayout& layout,
                                    const at::Tensor& local, const std::string& where);

 private:
  // A packed token range of a microbatch and where its output rows come from: this rank's own
  // forward output, or the gathered shard of group member `member`, from row `row`.
  struct PieceSource {
    static constexpr int kOwn = -1;
    int64_t begin = 0;
    int64_t count = 0;
    int member = kOwn;
    int64_t row = 0;
  };
  // Fills piece_sources_ with the microbatch's runs in token order; an internal error if the
  // pieces do not tile the microbatch.
  absl::Status ListRuns(const ShardLayout& layout, const std::string& where);
  absl::StatusOr<at::Tensor> GatherByPieces(collectives::Communicator& group,
                                            const ShardLayout& layout, const at::Tensor& local,
                                            const at::Tensor& padded, const std::string& where);
  absl::StatusOr<at::Tensor> GatherByIndex(collectives::Communicator& group,
                                           const ShardLayout& layout, const at::Tensor& local,
                                           const at::Tensor& padded, const std::string& where);

  // Kept between microbatches so their memory is reused.
  std::vector<int64_t> gather_index_;
  std::vector<PieceSource> piece_sources_;
};

}  // namespace internal
}  // namespace trainer
}  // namespace lockstep

#endif  // LOCKSTEP_TRAINER_INTERNAL_OUTPUT_ASSEMBLY_H_
