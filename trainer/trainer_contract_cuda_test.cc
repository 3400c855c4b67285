// gpu: the hand-back rule on CUDA. Processes sharing the one GPU over Gloo (NCCL needs a GPU per
// rank), each with its CPU and CUDA generators: between hand-backs the leader draws more than the
// others on both generators; right after every hand-back of both forward paths the replicas'
// caller states (the CPU state, the CUDA seed and offset) are bit-identical and DP workers stay
// distinct; with one path's synchronization off the divergence shows.

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "gtest/gtest.h"
#include "rng/rank_streams.h"
#include "rng/snapshot.h"
#include "testing/process_world.h"
#include "trainer/internal/contract_seams.h"
#include "trainer/trainer_rank.h"

namespace lockstep {
namespace trainer {
namespace {

absl::Status Expect(bool condition, const std::string& what) {
  return condition ? absl::OkStatus() : absl::InternalError(what);
}

// The caller's CPU state and CUDA seed and offset, hashed, as a byte tensor.
absl::StatusOr<at::Tensor> CallerDigest(const rng::RankStreams& streams) {
  LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot live, rng::RngSnapshot::Capture(streams.generators()));
  if (!live.cuda().has_value()) return absl::InternalError("no CUDA generator in the streams");
  const Sha256Digest digest =
      Sha256Framed({live.cpu_state(), absl::StrCat(live.cuda()->seed, "/", live.cuda()->offset)});
  at::Tensor bytes = at::empty({static_cast<int64_t>(digest.size())}, at::kByte);
  std::memcpy(bytes.data_ptr<uint8_t>(), digest.data(), digest.size());
  return bytes;
}

absl::StatusOr<bool> Agree(collectives::Communicator& group, const rng::RankStreams& streams) {
  LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor mine, CallerDigest(streams));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> all, group.AllGather(mine));
  for (const at::Tensor& theirs : all) {
    if (!at::equal(theirs, mine)) return false;
  }
  return true;
}

absl::Status DivergingDrawsBody(int rank, collectives::Communicator& world, bool use_stream,
                                bool control) {
  if (!at::hasCUDA()) return absl::FailedPreconditionError("a gpu test: it needs a CUDA device");
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::Topology topology,
                            collectives::Topology::CreateExact(4, 2, 1, 2));
  std::shared_ptr<collectives::Communicator> group;
  LOCKSTEP_ASSIGN_OR_RETURN(group, world.NewGroup(topology.TpCpGroup(rank)));
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<collectives::Communicator> dp_group,
                            world.NewGroup(topology.DpGroup(rank)));
  LOCKSTEP_ASSIGN_OR_RETURN(auto streams,
                            rng::RankStreams::Create(rng::DefaultGenerators::WithCudaDevice(0)));
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  at::manual_seed(1000 + rank);  // CPU and CUDA generators, differently on every rank
  const at::Tensor w = at::linspace(0.5, 1.5, 3, cuda).set_requires_grad(true);
  internal::ContractSeams seams;
  if (control) {
    seams.synchronize_after_each_microbatch = !use_stream;
    seams.synchronize_after_all_microbatches = use_stream;
  }
  TrainerConfig config = TrainerConfig::Of(16);
  config.plan.packing = planner::PACKING_IN_ORDER;
  LOCKSTEP_ASSIGN_OR_RETURN(
      auto trainer, internal::CreateWithSeams(
                        config, TrainerRank::Collaborators::Of(topology, rank, group, streams),
                        [&](const ShardWork& work) -> absl::StatusOr<at::Tensor> {
                          return at::dropout(work.inputs * w, 0.5, true);
                        },
                        seams));
  const std::vector<planner::Sequence> batch = {
      planner::Sequence::Of(10, 1), planner::Sequence::Of(6, 2), planner::Sequence::Of(12, 3),
      planner::Sequence::Of(4, 4)};
  const at::Tensor rows = at::cos(at::arange(32 * 3, cuda.dtype(at::kFloat)).reshape({32, 3}));
  int hand_backs = 0;
  auto after = [&]() -> absl::Status {
    ++hand_backs;
    LOCKSTEP_ASSIGN_OR_RETURN(bool replicas, Agree(*group, *streams));
    LOCKSTEP_RETURN_IF_ERROR(
        Expect(replicas, absl::StrCat("caller states differ after hand-back ", hand_backs)));
    LOCKSTEP_ASSIGN_OR_RETURN(bool workers, Agree(*dp_group, *streams));
    LOCKSTEP_RETURN_IF_ERROR(Expect(!workers, "DP workers' caller states became equal"));
    if (group->rank() == 0) {  // the leader draws more, on both generators
      (void)at::rand({3});
      (void)at::rand({3}, cuda);
    }
    return absl::OkStatus();
  };
  for (int call = 0; call < 2; ++call) {
    if (use_stream) {
      LOCKSTEP_ASSIGN_OR_RETURN(MicrobatchStream stream,
                                trainer->ForwardMicrobatches(TrainerInputs::Of(batch, rows)));
      while (true) {
        LOCKSTEP_ASSIGN_OR_RETURN(std::optional<MicrobatchOutput> out, stream.Next());
        if (!out) break;
        LOCKSTEP_RETURN_IF_ERROR(after());
      }
    } else {
      LOCKSTEP_RETURN_IF_ERROR(
          trainer->ForwardAllMicrobatches(TrainerInputs::Of(batch, rows)).status());
      LOCKSTEP_RETURN_IF_ERROR(after());
    }
  }
  return Expect(hand_backs == (use_stream ? 4 : 2), absl::StrCat(hand_backs, " hand-backs"));
}

TEST(TrainerContractCudaTest, EveryHandBackRepairsDivergedCallerStatesOnCuda) {
  // (CUDA is first touched in the ranks' processes: a context made here would not survive fork.)
  for (bool use_stream : {true, false}) {
    SCOPED_TRACE(use_stream ? "the stream" : "all at once");
    for (const absl::Status& s : collectives::RunProcessWorld(
             collectives::ProcessWorldOptions::Of(4), [&](int rank, collectives::Communicator&w) {
               return DivergingDrawsBody(rank, w, use_stream, false);
             })) {
      EXPECT_TRUE(s.ok()) << s;
    }
    int detected = 0;
    for (const absl::Status& s : collectives::RunProcessWorld(
             collectives::ProcessWorldOptions::Of(4), [&](int rank, collectives::Communicator&w) {
               return DivergingDrawsBody(rank, w, use_stream, true);
             })) {
      detected += absl::StrContains(s.message(), "caller states differ after hand-back");
    }
    EXPECT_GT(detected, 0) << "the missing synchronization went unnoticed";
  }
}

}  // namespace
}  // namespace trainer
}  // namespace lockstep
