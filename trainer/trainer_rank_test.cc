// TrainerRank on a world of one (no group): refusals with context, the stream contract's
// preconditions, save/load (exact continuation with the RNG streams, and the negative control
// without them), damaged saved state. (Multi-process cases: //qualification:oracle_test.)

#include "trainer/trainer_rank.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "admission/ledger.h"
#include "admission/memory_model.h"
#include "base/status_macros.h"
#include "base/status_testutil.h"
#include "base/stopwatch.h"
#include "base/torch_boundary.h"
#include "c10/util/Exception.h"
#include "checkpoint/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rng/model_stream.h"
#include "rng/resume_state.h"
#include "rng/snapshot.h"
#include "testing/fake_communicator.h"
#include "testing/fake_memory_probe.h"
#include "torch/optim/adam.h"
#include "torch/serialize.h"
#include "trainer/fake_cp_rank.h"
#include "trainer/saved_state.h"

namespace lockstep {
namespace trainer {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A per-token model with model-stream dropout: y = dropout(x * w).
struct TinyModel {
  at::Tensor w = at::linspace(0.5, 1.5, 4).set_requires_grad(true);
  absl::StatusOr<at::Tensor> Forward(const ShardWork& work) {
    return at::dropout(work.inputs * w, 0.3, /*train=*/true);
  }
};

struct Solo {
  std::shared_ptr<rng::RankStreams> streams;
  TinyModel model;
  std::unique_ptr<TrainerRank> trainer;
  std::unique_ptr<torch::optim::Adam> adam;
  numerics::NamedTensors named() { return {{"w", model.w}}; }
};

absl::StatusOr<std::unique_ptr<Solo>> MakeSolo(int64_t seed) {
  auto solo = std::make_unique<Solo>();
  at::manual_seed(seed);
  LOCKSTEP_ASSIGN_OR_RETURN(solo->streams,
                            rng::RankStreams::Create(rng::DefaultGenerators::CpuOnly()));
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::Topology topology,
                            collectives::Topology::CreateExact(1, 1, 1, 1));
  LOCKSTEP_ASSIGN_OR_RETURN(
      solo->trainer,
      TrainerRank::Create(TrainerConfig::Of(16),
                          TrainerRank::Collaborators::Of(topology, 0, nullptr, solo->streams),
                          [m = &solo->model](const ShardWork& work) { return m->Forward(work); }));
  solo->adam = std::make_unique<torch::optim::Adam>(std::vector<at::Tensor>{solo->model.w},
                                                    torch::optim::AdamOptions(0.1));
  return solo;
}

// One step: inputs from the caller's RNG, the stream, a caller-drawn mask, Adam.
absl::Status Step(Solo& solo) {
  solo.adam->zero_grad();
  std::vector<planner::Sequence> batch = {planner::Sequence::Of(9, 1), planner::Sequence::Of(5, 2)};
  TrainerInputs inputs = TrainerInputs::Of(batch, at::randn({14, 4}));
  LOCKSTEP_ASSIGN_OR_RETURN(MicrobatchStream stream, solo.trainer->ForwardMicrobatches(inputs));
  while (true) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::optional<MicrobatchOutput> out, stream.Next());
    if (!out) break;
    at::Tensor mask = at::bernoulli(at::full({out->outputs.size(0), 1}, 0.7));
    (out->outputs * mask).pow(2).sum().backward();
  }
  solo.adam->step();
  return absl::OkStatus();
}

// One microbatch through a model whose two blocks run through ShardWork::RunBlock (model-stream
// dropout inside each), with activation checkpointing `on` or off: outputs, gradients and how
// many checkpoint nodes were alive after the forward.
struct BlockRun {
  at::Tensor output;
  at::Tensor gradient;
  int64_t nodes_after_forward = 0;
};

absl::StatusOr<BlockRun> RunBlocks(bool on) {
  at::manual_seed(7);
  LOCKSTEP_ASSIGN_OR_RETURN(std::shared_ptr<rng::RankStreams> streams,
                            rng::RankStreams::Create(rng::DefaultGenerators::CpuOnly()));
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::Topology topology,
                            collectives::Topology::CreateExact(1, 1, 1, 1));
  at::Tensor w = at::linspace(0.5, 1.5, 4).set_requires_grad(true);
  TrainerConfig config = TrainerConfig::Of(16);
  config.activation_checkpointing = on;
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::unique_ptr<TrainerRank> trainer,
      TrainerRank::Create(config, TrainerRank::Collaborators::Of(topology, 0, nullptr, streams),
                          [&w](const ShardWork& work) -> absl::StatusOr<at::Tensor> {
                            at::Tensor x = work.inputs;
                            for (int b = 0; b < 2; ++b) {
                              LOCKSTEP_ASSIGN_OR_RETURN(
                                  std::vector<at::Tensor> out,
                                  work.RunBlock(
                                      [&w](const std::vector<at::Tensor>& in) {
                                        return std::vector<at::Tensor>{
                                            at::dropout(in[0] * w, 0.5, /*train=*/true)};
                                      },
                                      {x}));
                              x = out[0];
                            }
                            return x;
                          }));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<MicrobatchOutput> outs,
                            trainer->ForwardAllMicrobatches(TrainerInputs::Of(
                                {planner::Sequence::Of(12, 1)}, at::randn({12, 4}))));
  BlockRun run;
  run.nodes_after_forward = checkpoint::RetainedState().nodes;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("backward", [&] {
    run.output = outs.at(0).outputs.detach().clone();
    outs.at(0).outputs.pow(2).sum().backward();
    run.gradient = w.grad().clone();
  }));
  return run;
}

// Checkpointed blocks recompute in backward with the forward's model-stream randomness: the
// gradients equal the plain run's bit for bit, the activations were really dropped (checkpoint
// nodes alive after the forward) and nothing is retained after backward.
TEST(TrainerRankTest, ActivationCheckpointingReplaysTheBlocksExactly) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(BlockRun plain, RunBlocks(false));
  EXPECT_EQ(plain.nodes_after_forward, 0);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(BlockRun checkpointed, RunBlocks(true));
  EXPECT_EQ(checkpointed.nodes_after_forward, 2);
  EXPECT_TRUE(at::equal(checkpointed.output, plain.output));
  EXPECT_TRUE(at::equal(checkpointed.gradient, plain.gradient));
  EXPECT_EQ(checkpoint::RetainedState().nodes, 0);
  // The masks are random (not all kept), so an unreplayed recompute would have shown.
  EXPECT_GT((plain.output == 0).sum().item<int64_t>(), 0);
}

TEST(TrainerRankTest, RunBlockReportsAThrowingBlockAsAStatus) {
  ShardWork work;
  const absl::StatusOr<std::vector<at::Tensor>> out = work.RunBlock(
      [](const std::vector<at::Tensor>& in) {
        return std::vector<at::Tensor>{at::mm(in[0], at::ones({3, 3}))};  // shape mismatch
      },
      {at::ones({2, 5})});
  // LibTorch's shape check (a c10::Error) through the one boundary: kInternal, with the context.
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInternal) << out.status();
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("running a model block"));
  EXPECT_EQ(work.RunBlock(nullptr, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

// A fresh ledger file for one test.
absl::StatusOr<std::shared_ptr<admission::Ledger>> FreshLedger(const std::string& name) {
  const std::string path = ::testing::TempDir() + "/" + name + ".db";
  admission::RemoveLedgerFiles(path);
  return admission::Ledger::OpenWriter(path, admission::LedgerOptions::Of(0));
}

// A trainer of a world of one over y = x * w, with `ledger` and an optional out-of-memory failure
// of the first attempt at any microbatch of more than `oom_above` tokens.
struct LedgerRig {
  std::shared_ptr<rng::RankStreams> streams;
  at::Tensor w = at::linspace(0.5, 1.5, 4).set_requires_grad(true);
  int oom_left = 0;
  int64_t oom_above = 0;
  std::unique_ptr<TrainerRank> trainer;
};

absl::Status MakeLedgerRig(LedgerRig& rig, std::shared_ptr<admission::Ledger> ledger, int ooms = 0,
                           int64_t oom_above = 0) {
  LOCKSTEP_ASSIGN_OR_RETURN(rig.streams,
                            rng::RankStreams::Create(rng::DefaultGenerators::CpuOnly()));
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::Topology topology,
                            collectives::Topology::CreateExact(1, 1, 1, 1));
  rig.oom_left = ooms;
  rig.oom_above = oom_above;
  TrainerConfig config = TrainerConfig::Of(8);
  config.plan.packing = planner::PACKING_IN_ORDER;
  if (ooms > 0) {
    LOCKSTEP_ASSIGN_OR_RETURN(config.memory_model, admission::MemoryModel::Of(1e3, 1e2));
    config.memory_cap_bytes = int64_t{1} << 40;
  }
  auto collaborators = TrainerRank::Collaborators::Of(topology, 0, nullptr, rig.streams);
  collaborators.ledger = ledger;
  LOCKSTEP_ASSIGN_OR_RETURN(
      rig.trainer,
      TrainerRank::Create(
          config, collaborators, [&rig](const ShardWork& work) -> absl::StatusOr<at::Tensor> {
            if (work.inputs.size(0) > rig.oom_above && rig.oom_left > 0) {
              --rig.oom_left;
              throw c10::OutOfMemoryError({__func__, __FILE__, __LINE__}, "injected out of memory");
            }
            return work.inputs * rig.w;
          }));
  return absl::OkStatus();
}

TrainerInputs LedgerBatch() {
  return TrainerInputs::Of(
      {planner::Sequence::Of(6, 1), planner::Sequence::Of(5, 2), planner::Sequence::Of(4, 3)},
      at::randn({15, 4}));
}

// Every forward call is a step of the ledger: its plan, each microbatch started and completed,
// the step committed at the last hand-back; a new trainer over the ledger goes on after them. A
// stream left unfinished leaves its step open with the tokens the caller never received named,
// and no later call begins over it.
TEST(TrainerRankLedgerTest, EveryForwardCallIsALedgerStep) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<admission::Ledger> ledger,
                                FreshLedger("trainer_calls"));
  LedgerRig rig;
  LOCKSTEP_ASSERT_OK(MakeLedgerRig(rig, ledger));
  {  // step 0: the stream, to its end
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(MicrobatchStream stream,
                                  rig.trainer->ForwardMicrobatches(LedgerBatch()));
    for (;;) {
      LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::optional<MicrobatchOutput> out, stream.Next());
      if (!out.has_value()) break;
    }
  }
  // step 1: DpRankForward
  LOCKSTEP_ASSERT_OK(rig.trainer->ForwardAllMicrobatches(LedgerBatch()).status());
  // A new trainer over the same ledger (as after a restart) goes on with step 2.
  LedgerRig again;
  LOCKSTEP_ASSERT_OK(MakeLedgerRig(again, ledger));
  LOCKSTEP_ASSERT_OK(again.trainer->ForwardAllMicrobatches(LedgerBatch()).status());
  {  // step 3: abandoned after its first microbatch
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(MicrobatchStream stream,
                                  again.trainer->ForwardMicrobatches(LedgerBatch()));
    LOCKSTEP_ASSERT_OK(stream.Next().status());
  }
  LOCKSTEP_ASSERT_OK(ledger->AwaitDurable());  // the trainer's writes are queued
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(admission::LedgerReplay replay,
                                admission::Ledger::Replay(ledger->path()));
  ASSERT_EQ(replay.steps.size(), 4u) << replay.Summary();
  for (int step : {0, 1, 2}) {
    EXPECT_EQ(replay.steps[step].step, step);
    const admission::StepReplay& s = replay.steps[step];
    EXPECT_TRUE(s.committed) << replay.Summary();
    EXPECT_EQ(s.completed_tokens, 15);
    EXPECT_EQ(s.completed_microbatches.size(), 3u);
    EXPECT_EQ(s.event_counts[static_cast<int>(admission::LedgerEventKind::kStarted)], 3);
  }
  const admission::StepReplay& open = replay.steps[3];
  EXPECT_FALSE(open.committed);
  EXPECT_EQ(open.completed_microbatches, std::vector<std::string>{"0"});
  EXPECT_EQ(open.completed_tokens, 6);
  EXPECT_FALSE(open.missing.empty());

  // The open step is not overwritten: the next call is refused, naming it, and writes nothing.
  const absl::Status refused = again.trainer->ForwardAllMicrobatches(LedgerBatch()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("step 3 began and has not committed"));
  LOCKSTEP_ASSERT_OK(ledger->AwaitDurable());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(replay, admission::Ledger::Replay(ledger->path()));
  EXPECT_EQ(replay.steps.size(), 4u);
}

// An out-of-memory attempt is recorded as failed and split; the halves complete, every token once.
TEST(TrainerRankLedgerTest, RecoveryIsRecordedAndEveryTokenCompletesOnce) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<admission::Ledger> ledger,
                                FreshLedger("trainer_recovery"));
  LedgerRig rig;
  LOCKSTEP_ASSERT_OK(MakeLedgerRig(rig, ledger, /*ooms=*/1, /*oom_above=*/5));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::vector<MicrobatchOutput> outs,
                                rig.trainer->ForwardAllMicrobatches(LedgerBatch()));
  EXPECT_EQ(outs.size(), 4u);
  EXPECT_EQ(rig.trainer->out_of_memory_recovered(), 1);
  LOCKSTEP_ASSERT_OK(ledger->AwaitDurable());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(admission::LedgerReplay replay,
                                admission::Ledger::Replay(ledger->path()));
  ASSERT_EQ(replay.steps.size(), 1u);
  const admission::StepReplay& step = replay.steps[0];
  EXPECT_TRUE(step.committed) << replay.Summary();
  EXPECT_EQ(step.completed_tokens, 15);
  EXPECT_EQ(step.event_counts[static_cast<int>(admission::LedgerEventKind::kFailed)], 1);
  EXPECT_EQ(step.event_counts[static_cast<int>(admission::LedgerEventKind::kSplit)], 1);
  EXPECT_EQ(step.completed_microbatches, (std::vector<std::string>{"0.0", "0.1", "1", "2"}));
}

std::string StateDir(const std::string& name) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/trainer_state_", name, "_", getpid());
  RemoveSavedState(dir);
  return dir;
}

TEST(TrainerRankTest, RestartFromSavedStateContinuesBitExactly) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Solo> first, MakeSolo(5));
  LOCKSTEP_ASSERT_OK(Step(*first));
  const std::string dir = StateDir("exact");
  SaveOptions options;
  options.include_rng_streams = true;
  LOCKSTEP_ASSERT_OK(first->trainer->SaveState(dir, first->named(), first->adam.get(), options));
  LOCKSTEP_ASSERT_OK(Step(*first));
  LOCKSTEP_ASSERT_OK(Step(*first));

  // Another process's state until the load.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Solo> restarted, MakeSolo(77));
  auto named = restarted->named();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LoadReport report,
                                restarted->trainer->LoadState(dir, named, restarted->adam.get()));
  EXPECT_EQ(report.weights, 1);
  EXPECT_TRUE(report.optimizer);
  EXPECT_TRUE(report.rng_streams);
  LOCKSTEP_ASSERT_OK(Step(*restarted));
  LOCKSTEP_ASSERT_OK(Step(*restarted));
  EXPECT_TRUE(at::equal(restarted->model.w, first->model.w))
      << restarted->model.w << " vs " << first->model.w;

  // Negative control: the same restart without the RNG streams does not continue exactly.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Solo> first_again, MakeSolo(5));
  LOCKSTEP_ASSERT_OK(Step(*first_again));
  const std::string no_rng = StateDir("no_rng");
  LOCKSTEP_ASSERT_OK(first_again->trainer->SaveState(no_rng, first_again->named(),
                                                     first_again->adam.get(), SaveOptions()));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Solo> without, MakeSolo(77));
  auto without_named = without->named();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      LoadReport partial, without->trainer->LoadState(no_rng, without_named, without->adam.get()));
  EXPECT_FALSE(partial.rng_streams);
  LOCKSTEP_ASSERT_OK(Step(*without));
  LOCKSTEP_ASSERT_OK(Step(*without));
  EXPECT_FALSE(at::equal(without->model.w, first->model.w))
      << "without the RNG streams the restart must draw differently";
}

TEST(TrainerRankTest, SavedStateIsRefusedWhenItDoesNotFit) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Solo> solo, MakeSolo(1));
  LOCKSTEP_ASSERT_OK(Step(*solo));
  const std::string dir = StateDir("refusals");
  SaveOptions options;
  options.include_rng_streams = true;
  LOCKSTEP_ASSERT_OK(solo->trainer->SaveState(dir, solo->named(), solo->adam.get(), options));
  EXPECT_EQ(solo->trainer->SaveState(dir, solo->named(), nullptr, options).code(),
            absl::StatusCode::kFailedPrecondition);

  at::Tensor other = at::zeros({5});
  numerics::NamedTensors wrong_shape = {{"w", other}};
  EXPECT_THAT(solo->trainer->LoadState(dir, wrong_shape, nullptr).status().message(),
              HasSubstr("weight 'w' was saved with another shape or dtype"));
  numerics::NamedTensors wrong_name = {{"v", at::zeros({4})}};
  EXPECT_THAT(solo->trainer->LoadState(dir, wrong_name, nullptr).status().message(),
              HasSubstr("no saved weight named 'v'"));

  // A damaged RNG file: kDataLoss, and nothing changed (weights included).
  {
    std::fstream rng(absl::StrCat(dir, "/rng.bin"),
                     std::ios::in | std::ios::out | std::ios::binary);
    rng.seekp(20);
    rng.put('\x5a');
  }
  auto named = solo->named();
  {
    at::NoGradGuard no_grad;
    solo->model.w.add_(1.0);
  }
  const at::Tensor changed = solo->model.w.detach().clone();
  EXPECT_EQ(solo->trainer->LoadState(dir, named, nullptr).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_TRUE(at::equal(solo->model.w, changed)) << "a refused load must change nothing";
  EXPECT_EQ(solo->trainer->LoadState(StateDir("absent"), named, nullptr).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TrainerRankTest, BadCollaboratorsAndInputsAreNamed) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams,
                                rng::RankStreams::Create(rng::DefaultGenerators::CpuOnly()));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const collectives::Topology topology,
                                collectives::Topology::CreateExact(1, 1, 1, 1));
  auto forward = [](const ShardWork& work) -> absl::StatusOr<at::Tensor> { return work.inputs; };
  EXPECT_THAT(
      TrainerRank::Create(TrainerConfig::Of(1),
                          TrainerRank::Collaborators::Of(topology, 0, nullptr, streams), forward)
          .status()
          .message(),
      HasSubstr("max_tokens_per_microbatch 1 is below 2 x CP size (2)"));
  EXPECT_EQ(
      TrainerRank::Create(TrainerConfig::Of(8),
                          TrainerRank::Collaborators::Of(topology, 0, nullptr, nullptr), forward)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const collectives::Topology cp2,
                                collectives::Topology::CreateExact(2, 1, 1, 2));
  EXPECT_THAT(TrainerRank::Create(TrainerConfig::Of(8),
                                  TrainerRank::Collaborators::Of(cp2, 0, nullptr, streams), forward)
                  .status()
                  .message(),
              HasSubstr("not its TP x CP group [0, 1] (no group given)"));

  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      auto trainer,
      TrainerRank::Create(TrainerConfig::Of(8),
                          TrainerRank::Collaborators::Of(topology, 0, nullptr, streams),
                          [](const ShardWork& work) -> absl::StatusOr<at::Tensor> {
                            return work.inputs.slice(0, 0, 1);  // wrong rows
                          }));
  std::vector<planner::Sequence> batch = {planner::Sequence::Of(3, 1)};
  EXPECT_THAT(
      trainer->ForwardMicrobatches(TrainerInputs::Of(batch, at::zeros({4, 2}))).status().message(),
      HasSubstr("one row per token of the sequences (3)"));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      MicrobatchStream stream,
      trainer->ForwardMicrobatches(TrainerInputs::Of(batch, at::zeros({3, 2}))));
  absl::StatusOr<std::optional<MicrobatchOutput>> next = stream.Next();
  EXPECT_THAT(next.status().message(),
              HasSubstr("microbatch 0: the forward adapter returned 1 rows for 3 tokens"));
  EXPECT_THAT(next.status().message(), HasSubstr("trainer rank 0"));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::optional<MicrobatchOutput> after, stream.Next());
  EXPECT_FALSE(after.has_value()) << "a failed stream is finished";
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(rng::ModelStreamScope scope,
                                  rng::ModelStreamScope::Enter(*streams));
    EXPECT_EQ(
        trainer->ForwardMicrobatches(TrainerInputs::Of(batch, at::zeros({3, 2}))).status().code(),
        absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(trainer->ForwardAllMicrobatches(TrainerInputs::Of(batch, at::zeros({3, 2})))
                  .status()
                  .code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

// Checks what the forward adapter sees of its shard against the plan, token by token: the packed
// offsets are ShardTokenIndices; each token's sequence id, position and input row follow from the
// packed sequence it falls in. Returns what the plan assigns.
absl::StatusOr<PlannedShardTokens> CheckShardTokens(const ShardWork& work,
                                                    const std::vector<planner::Sequence>& batch,
                                                    const at::Tensor& rows) {
  LOCKSTEP_ASSIGN_OR_RETURN(PlannedShardTokens planned, PlannedTokensOf(work, batch));
  const at::Tensor expected_rows = rows.index_select(0, at::tensor(planned.input_rows, at::kLong));
  int64_t piece_tokens = 0;
  for (const planner::ShardPiece& p : work.pieces()) piece_tokens += p.end - p.begin;
  if (piece_tokens != static_cast<int64_t>(planned.offsets.size()) ||
      !at::equal(work.packed_offsets(), at::tensor(planned.offsets, at::kLong)) ||
      !at::equal(work.sequence_ids(), at::tensor(planned.ids, at::kLong)) ||
      !at::equal(work.positions(), at::tensor(planned.positions, at::kLong)) ||
      !at::equal(work.inputs, expected_rows)) {
    return absl::InternalError(
        absl::StrCat("CP rank ", work.cp_rank, ", microbatch ", work.microbatch,
                     ": the shard's per-token view disagrees with the plan"));
  }
  return planned;
}

// The thread fake (one process: the ranks share the default generators, so the RNG contract is
// tested on processes in //qualification:oracle_test; here the scope and synchronization are off
// and the gather itself is under test): a CP group of all the world's ranks forwards `batch`
// (microbatches of at most `max_tokens`) through a model that scales its rows by a parameter w;
// every rank must receive the full outputs in packed order, differentiable into w and into the
// input rows through its own rows only (the rows' selection, by a view, a strided copy, a
// concatenation or an index, keeps them in the graph).
absl::Status GatherBody(collectives::Communicator& world,
                        const std::vector<planner::Sequence>& batch, int64_t max_tokens,
                        int expected_microbatches) {
  const at::Tensor w = at::full({1}, 2.0, at::kFloat).set_requires_grad(true);
  int64_t tokens = 0;
  for (const planner::Sequence& s : batch) tokens += s.num_tokens;
  const at::Tensor rows = at::arange(2 * tokens, at::kFloat).reshape({tokens, 2}).requires_grad_();
  std::vector<at::Tensor> my_inputs;
  std::vector<int64_t> own_rows;
  LOCKSTEP_ASSIGN_OR_RETURN(
      FakeCpRank rank,
      CreateFakeCpRank(world, max_tokens, [&](const ShardWork& work) -> absl::StatusOr<at::Tensor> {
        LOCKSTEP_ASSIGN_OR_RETURN(PlannedShardTokens planned, CheckShardTokens(work, batch, rows));
        own_rows.insert(own_rows.end(), planned.input_rows.begin(), planned.input_rows.end());
        my_inputs.push_back(work.inputs);
        return work.inputs * w;
      }));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<MicrobatchOutput> outputs,
                            rank.trainer->ForwardAllMicrobatches(TrainerInputs::Of(batch, rows)));
  if (static_cast<int>(outputs.size()) != expected_microbatches) {
    return absl::InternalError(
        absl::StrCat("expected ", expected_microbatches, " microbatches, got ", outputs.size()));
  }
  at::Tensor total = at::zeros({}, at::kFloat);
  for (const MicrobatchOutput& out : outputs) {
    if (!at::equal(out.outputs, rows.index_select(0, out.input_rows) * 2)) {
      return absl::InternalError(absl::StrCat("rank ", world.rank(), ": microbatch ",
                                              out.microbatch, " gathered wrong outputs"));
    }
    total = total + out.outputs.sum();
  }
  // d(sum of outputs)/dw: the sum of this rank's own input rows, and nothing from the others'.
  total.backward();
  at::Tensor own = at::zeros({}, at::kFloat);
  for (const at::Tensor& in : my_inputs) own = own + in.sum();
  if (!w.grad().defined() || !at::allclose(w.grad(), own.reshape({1}))) {
    return absl::InternalError(absl::StrCat("rank ", world.rank(), ": gradient ",
                                            w.grad().defined() ? w.grad().item<float>() : -1.0f,
                                            " instead of the own rows' sum ", own.item<float>()));
  }
  // d(sum of outputs)/d(rows): w (2) on each row this rank's shards hold, 0 on the others' rows.
  at::Tensor expected = at::zeros({tokens, 2}, at::kFloat);
  if (!own_rows.empty()) expected.index_fill_(0, at::tensor(own_rows, at::kLong), 2.0);
  if (!rows.grad().defined() || !at::equal(rows.grad(), expected)) {
    return absl::InternalError(absl::StrCat(
        "rank ", world.rank(), ": the input rows' gradient sums to ",
        rows.grad().defined() ? rows.grad().sum().item<float>() : -1.0f, " instead of ",
        expected.sum().item<float>(), " (2 on each of this rank's rows)"));
  }
  return absl::OkStatus();
}

// CP4, a microbatch of one token leaves three ranks empty (few pieces: one copy each).
absl::Status FewPiecesGatherBody(collectives::Communicator& world) {
  return GatherBody(
      world,
      {planner::Sequence::Of(9, 1), planner::Sequence::Of(2, 2), planner::Sequence::Of(1, 3)}, 11,
      2);
}

TEST(TrainerRankFakeWorldTest, ManyShortSequencesGatherThroughTheListedIndex) {
  // 40 sequences of 4 tokens over CP2: 80 pieces per rank, beyond the per-piece copies.
  std::vector<planner::Sequence> batch;
  for (int i = 0; i < 40; ++i) batch.push_back(planner::Sequence::Of(4, i + 1));
  collectives::FakeWorld world(2);
  for (const absl::Status& s :
       world.Run([&](collectives::Communicator& w) { return GatherBody(w, batch, 160, 1); })) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(TrainerRankFakeWorldTest, OneLongSequenceSelectsEachRanksChunks) {
  // One sequence per microbatch: each CP rank's two chunks, of one length (64 tokens: one strided
  // copy) or not (67 tokens over CP4: chunks of 9 and 8 tokens on some ranks, a concatenation).
  for (const int64_t length : {64, 67}) {
    for (const int cp : {2, 4}) {
      collectives::FakeWorld world(cp);
      for (const absl::Status& s : world.Run([&](collectives::Communicator& w) {
             return GatherBody(w, {planner::Sequence::Of(length, 7)}, length, 1);
           })) {
        EXPECT_TRUE(s.ok()) << "length " << length << ", CP " << cp << ": " << s;
      }
    }
  }
}

TEST(TrainerRankFakeWorldTest, EveryRankGetsFullOutputsIncludingEmptyShards) {
  collectives::FakeWorld world(4);
  for (const absl::Status& s : world.Run(FewPiecesGatherBody)) EXPECT_TRUE(s.ok()) << s;
}

TEST(TrainerRankFakeWorldTest, ARankFailingInACollectiveFailsEveryRankWithoutAHang) {
  for (int call : {0, 1, 2}) {  // the plan agreement, the first outcome vote, the first gather
    collectives::FakeWorld world(4, collectives::FakeWorld::Options::Of(absl::Seconds(5)));
    world.InjectFailure(/*rank=*/2, call);
    const Stopwatch start;
    const std::vector<absl::Status> results = world.Run(FewPiecesGatherBody);
    EXPECT_LT(start.Elapsed(), absl::Seconds(15));
    // The failing rank: kAborted (the fake's injected failure); its peers: kUnavailable naming it.
    for (size_t r = 0; r < results.size(); ++r) {
      SCOPED_TRACE(absl::StrCat("call ", call, ", rank ", r, ": ", results[r].ToString()));
      if (r == 2) {
        EXPECT_EQ(results[r].code(), absl::StatusCode::kAborted);
      } else {
        EXPECT_EQ(results[r].code(), absl::StatusCode::kUnavailable);
        EXPECT_THAT(std::string(results[r].message()), HasSubstr("rank(s) [2] failed"));
      }
    }
  }
}

// --- Outside the happy path, on a world of one
// ----------------------------------------------------

// The caller's state as bytes, to compare bit for bit.
std::string CallerBytes(const rng::RankStreams& streams) {
  return rng::RngSnapshot::Capture(streams.generators())->cpu_state();
}

// A forward that draws from the model stream and then throws: the caller's state is bit-exact as
// before the call, and the model stream is where it stood before the failed microbatch's attempt
// (as after the microbatch handed back before it), so the next call runs normally.
TEST(TrainerRankTest, AForwardThatDrawsThenThrowsLeavesTheCallerExactAndTheModelStreamRewound) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams,
                                rng::RankStreams::Create(rng::DefaultGenerators::CpuOnly()));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const collectives::Topology topology,
                                collectives::Topology::CreateExact(1, 1, 1, 1));
  int calls = 0;
  TrainerConfig config = TrainerConfig::Of(8);
  config.plan.packing = planner::PACKING_IN_ORDER;
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      auto trainer,
      TrainerRank::Create(config, TrainerRank::Collaborators::Of(topology, 0, nullptr, streams),
                          [&](const ShardWork& work) -> absl::StatusOr<at::Tensor> {
                            at::Tensor y = at::dropout(work.inputs, 0.5, true);
                            if (++calls == 2) throw std::runtime_error("injected after a draw");
                            return y;
                          }));
  const std::vector<planner::Sequence> batch = {planner::Sequence::Of(6, 1),
                                                planner::Sequence::Of(5, 2)};
  const std::string caller_before = CallerBytes(*streams);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      MicrobatchStream stream,
      trainer->ForwardMicrobatches(TrainerInputs::Of(batch, at::ones({11, 2}))));
  LOCKSTEP_ASSERT_OK(stream.Next().status());
  const std::optional<rng::RngSnapshot> model_after_first = streams->model().state();
  const absl::StatusOr<std::optional<MicrobatchOutput>> failed = stream.Next();
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();
  EXPECT_THAT(std::string(failed.status().message()),
              AllOf(HasSubstr("injected after a draw"), HasSubstr("microbatch 1")));
  EXPECT_EQ(CallerBytes(*streams), caller_before) << "the caller's state moved";
  ASSERT_TRUE(model_after_first.has_value() && streams->model().state().has_value());
  EXPECT_TRUE(*streams->model().state() == *model_after_first)
      << "the model stream kept the failed attempt's draws";
  EXPECT_TRUE(streams->caller_state_live());
  calls = 10;  // no more failures
  LOCKSTEP_EXPECT_OK(trainer->ForwardAllMicrobatches(TrainerInputs::Of(batch, at::ones({11, 2}))));
}

// A stream dropped after one Next(): no scope left open, the caller untouched, the next call works.
TEST(TrainerRankTest, AStreamAbandonedAfterOneNextLeavesNothingBehind) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Solo> solo, MakeSolo(3));
  const std::vector<planner::Sequence> batch = {planner::Sequence::Of(9, 1),
                                                planner::Sequence::Of(9, 2)};
  const at::Tensor rows = at::randn({18, 4});
  const std::string caller_before = CallerBytes(*solo->streams);
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(MicrobatchStream stream, solo->trainer->ForwardMicrobatches(
                                                               TrainerInputs::Of(batch, rows)));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::optional<MicrobatchOutput> first, stream.Next());
    ASSERT_TRUE(first.has_value());
    ASSERT_GT(stream.plan().microbatches_size(), 1);
  }
  EXPECT_TRUE(solo->streams->caller_state_live()) << "a scope was left open";
  EXPECT_EQ(CallerBytes(*solo->streams), caller_before);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      std::vector<MicrobatchOutput> all,
      solo->trainer->ForwardAllMicrobatches(TrainerInputs::Of(batch, rows)));
  EXPECT_EQ(all.size(), 2u);
}

// A stream is move-only (a copy would run each forward twice and leave its ledger step open) and
// refers to its trainer weakly: after the trainer is gone, Next() is refused.
static_assert(!std::is_copy_constructible_v<MicrobatchStream>);
static_assert(!std::is_copy_assignable_v<MicrobatchStream>);
static_assert(std::is_move_constructible_v<MicrobatchStream>);

TEST(TrainerRankTest, AStreamThatOutlivesItsTrainerIsRefused) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Solo> solo, MakeSolo(3));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(MicrobatchStream stream,
                                solo->trainer->ForwardMicrobatches(TrainerInputs::Of(
                                    {planner::Sequence::Of(9, 1)}, at::randn({9, 4}))));
  MicrobatchStream moved = std::move(stream);
  solo->trainer.reset();
  const absl::StatusOr<std::optional<MicrobatchOutput>> next = moved.Next();
  EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(next.status().message()), HasSubstr("was destroyed"));
}

// The caller reseeds between two forwards: its draws continue from its own seed, as if the
// library were not there.
TEST(TrainerRankTest, ACallerReseedBetweenForwardsContinuesFromTheCallersSeed) {
  at::manual_seed(123);
  const at::Tensor expected = at::rand({6});
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Solo> solo, MakeSolo(3));
  LOCKSTEP_ASSERT_OK(Step(*solo));
  at::manual_seed(123);
  const std::vector<planner::Sequence> batch = {planner::Sequence::Of(9, 1)};
  LOCKSTEP_ASSERT_OK(
      solo->trainer->ForwardAllMicrobatches(TrainerInputs::Of(batch, at::ones({9, 4}))).status());
  EXPECT_TRUE(at::equal(at::rand({6}), expected)) << "model work moved the reseeded caller";
}

// One checkpointed block with two outputs, back-propagated separately (retain_graph): each
// recompute replays the forward's mask (gradients equal the plain run's) and nothing is retained
// after the last backward.
absl::StatusOr<at::Tensor> TwoOutputBlockGradient(bool checkpointed) {
  at::manual_seed(11);
  LOCKSTEP_ASSIGN_OR_RETURN(std::shared_ptr<rng::RankStreams> streams,
                            rng::RankStreams::Create(rng::DefaultGenerators::CpuOnly()));
  LOCKSTEP_ASSIGN_OR_RETURN(const collectives::Topology topology,
                            collectives::Topology::CreateExact(1, 1, 1, 1));
  at::Tensor w = at::linspace(0.5, 1.5, 4).set_requires_grad(true);
  TrainerConfig config = TrainerConfig::Of(16);
  config.activation_checkpointing = checkpointed;
  std::vector<at::Tensor> outputs;
  LOCKSTEP_ASSIGN_OR_RETURN(
      auto trainer,
      TrainerRank::Create(config, TrainerRank::Collaborators::Of(topology, 0, nullptr, streams),
                          [&](const ShardWork& work) -> absl::StatusOr<at::Tensor> {
                            LOCKSTEP_ASSIGN_OR_RETURN(
                                outputs, work.RunBlock(
                                             [&w](const std::vector<at::Tensor>& in) {
                                               at::Tensor h = at::dropout(in[0] * w, 0.5, true);
                                               return std::vector<at::Tensor>{h, h * h};
                                             },
                                             {work.inputs}));
                            return outputs[0];
                          }));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<MicrobatchOutput> outs,
                            trainer->ForwardAllMicrobatches(TrainerInputs::Of(
                                {planner::Sequence::Of(12, 1)}, at::randn({12, 4}))));
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("two backwards", [&] {
    outputs[0].sum().backward({}, /*retain_graph=*/true);
    outputs[1].sum().backward();
  }));
  return w.grad().clone();
}

TEST(TrainerRankTest, ACheckpointedBlockWithTwoOutputsReplaysOneMaskPerRecomputeAndRetainsNothing) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor plain, TwoOutputBlockGradient(false));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const at::Tensor checkpointed, TwoOutputBlockGradient(true));
  EXPECT_TRUE(at::equal(plain, checkpointed)) << plain << " vs " << checkpointed;
  EXPECT_EQ(checkpoint::RetainedState().nodes, 0);
}

// --- Saved state: all or nothing
// ------------------------------------------------------------------

// The optimizer's state as bytes (torch::save), to compare bit for bit.
std::string OptimizerBytes(const torch::optim::Optimizer& optimizer) {
  std::ostringstream bytes;
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  archive.save_to(bytes);
  return bytes.str();
}

// Overwrites `count` bytes of `path` at `offset` with 0x5a, or cuts it to `offset` bytes.
void Damage(const std::string& path, int64_t offset, int count, bool cut) {
  if (cut) {
    ASSERT_EQ(truncate(path.c_str(), offset), 0);
    return;
  }
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(offset);
  for (int i = 0; i < count; ++i) file.put('\x5a');
}

// A damaged optimizer archive, cut weights, a resume state of another generator set: each is
// refused and leaves the weights, the optimizer and the RNG streams bit-identical to before.
TEST(TrainerRankTest, ARefusedLoadChangesNothing) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Solo> solo, MakeSolo(1));
  LOCKSTEP_ASSERT_OK(Step(*solo));
  SaveOptions options;
  options.include_rng_streams = true;
  const std::string saved = StateDir("pristine");
  LOCKSTEP_ASSERT_OK(solo->trainer->SaveState(saved, solo->named(), solo->adam.get(), options));
  LOCKSTEP_ASSERT_OK(Step(*solo));  // move on, so that a load would change everything
  const at::Tensor weights = solo->model.w.detach().clone();
  const std::string adam = OptimizerBytes(*solo->adam);
  const std::string caller = CallerBytes(*solo->streams);
  auto expect_unchanged = [&](const std::string& what) {
    EXPECT_TRUE(at::equal(solo->model.w, weights)) << what << ": the weights changed";
    EXPECT_EQ(OptimizerBytes(*solo->adam), adam) << what << ": the optimizer changed";
    EXPECT_EQ(CallerBytes(*solo->streams), caller) << what << ": the RNG streams changed";
  };
  auto copy_of = [&](const std::string& name) {
    const std::string dir = StateDir(name);
    std::filesystem::copy(saved, dir);
    return dir;
  };
  auto named = solo->named();
  {
    const std::string dir = copy_of("damaged_optimizer");
    Damage(dir + "/optimizer.pt", 100, 64, false);
    const absl::Status s = solo->trainer->LoadState(dir, named, solo->adam.get()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("optimizer.pt"));
    expect_unchanged("damaged optimizer.pt");
  }
  {
    const std::string dir = copy_of("cut_weights");
    Damage(dir + "/weights.safetensors", 40, 0, true);
    const absl::Status s = solo->trainer->LoadState(dir, named, solo->adam.get()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    expect_unchanged("cut weights");
  }
  {
    // A resume state of another generator set (a rank with CUDA device 0), sealed intact.
    const std::string dir = copy_of("other_generators");
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(rng::RngResumeStateProto state,
                                  rng::CaptureResumeState(*solo->streams));
    state.set_cuda_device(0);
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::string bytes, rng::SerializeResumeState(state));
    std::ofstream(dir + "/rng.bin", std::ios::binary | std::ios::trunc) << bytes;
    const absl::Status s = solo->trainer->LoadState(dir, named, solo->adam.get()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    expect_unchanged("another generator set");
  }
  // The pristine copy still loads.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LoadReport report,
                                solo->trainer->LoadState(saved, named, solo->adam.get()));
  EXPECT_TRUE(report.optimizer && report.rng_streams);
  EXPECT_FALSE(at::equal(solo->model.w, weights));
}

// LibTorch loads an optimizer group by group and checks a group's size only when it reaches it, so
// a refused load may already have changed the groups before; and it only assigns the state it
// reads, so state it gave a parameter that had none stays after reloading the old archive. A
// refused load puts back exactly the state from before: here the second group has another size.
TEST(SavedStateTest, ARefusedOptimizerLoadPutsBackWhatThePartialLoadChanged) {
  for (const bool stepped : {true, false}) {
    SCOPED_TRACE(stepped ? "the loading optimizer has state" : "the loading optimizer has none");
    at::manual_seed(3);
    at::Tensor w = at::randn({3}).requires_grad_();
    at::Tensor b = at::randn({2}).requires_grad_();
    at::Tensor c = at::randn({2}).requires_grad_();
    auto step = [](torch::optim::Optimizer& adam, const std::vector<at::Tensor>& params,
                   double scale) {
      adam.zero_grad();
      at::Tensor loss = at::zeros({});
      for (const at::Tensor& p : params) loss = loss + (p * scale).pow(2).sum();
      loss.backward();
      adam.step();
    };
    std::vector<torch::optim::OptimizerParamGroup> saved_groups = {
        torch::optim::OptimizerParamGroup({w}), torch::optim::OptimizerParamGroup({b, c})};
    torch::optim::Adam saved(saved_groups, torch::optim::AdamOptions(1e-2));
    step(saved, {w, b, c}, 1.0);
    step(saved, {w, b, c}, 1.0);
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<rng::RankStreams> streams,
                                  rng::RankStreams::Create(rng::DefaultGenerators::CpuOnly()));
    numerics::NamedTensors weights = {{"w", w}, {"b", b}, {"c", c}};
    const std::string dir = StateDir(absl::StrCat("partial_optimizer_", stepped));
    LOCKSTEP_ASSERT_OK(SaveTrainingState(dir, *streams, 0, weights, &saved, SaveOptions()));

    std::vector<torch::optim::OptimizerParamGroup> loading_groups = {
        torch::optim::OptimizerParamGroup({w}), torch::optim::OptimizerParamGroup({b})};
    torch::optim::Adam loading(loading_groups, torch::optim::AdamOptions(1e-2));
    if (stepped) step(loading, {w, b}, 3.0);
    const std::string before = OptimizerBytes(loading);
    const absl::Status refused = LoadTrainingState(dir, *streams, weights, &loading).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
    EXPECT_EQ(OptimizerBytes(loading), before) << "the refused load changed the optimizer";
    EXPECT_EQ(loading.state().size(), stepped ? 2u : 0u);
    RemoveSavedState(dir);
  }
}

// A save leaves the directory complete and nothing beside it; a save over an existing directory
// is refused without touching it.
TEST(TrainerRankTest, ASaveIsCompleteAndLeavesNoTemporary) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Solo> solo, MakeSolo(1));
  const std::string dir = StateDir("complete");
  LOCKSTEP_ASSERT_OK(solo->trainer->SaveState(dir, solo->named(), solo->adam.get(), SaveOptions()));
  int entries = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::path(dir).parent_path())) {
    entries += absl::StrContains(entry.path().filename().string(), "trainer_state_complete");
  }
  EXPECT_EQ(entries, 1) << "a temporary directory was left beside the saved state";
  for (const char* name : {"weights.safetensors", "optimizer.pt", "trainer.txt"}) {
    EXPECT_TRUE(std::filesystem::exists(absl::StrCat(dir, "/", name))) << name;
  }
}

// --- Cumulative admission
// ---------------------------------------------------------------------------

// A fake device whose memory the forward uses: each microbatch's forward holds `retained` bytes
// per token until its outputs are released, and peaks `transient` bytes per token above that.
struct FakeDevice {
  std::shared_ptr<admission::FakeMemoryProbe> probe =
      std::make_shared<admission::FakeMemoryProbe>(int64_t{1} << 30);
  int64_t held = 0;
  int64_t peak = 0;
  static constexpr int64_t kFixed = 1000, kTransient = 100, kRetained = 40;
  int64_t Forward(int64_t tokens) {
    peak = std::max(peak, kFixed + held + kTransient * tokens);
    probe->Touch(kFixed + held + kTransient * tokens);
    held += kRetained * tokens;
    probe->Hold(kFixed + held);
    return kRetained * tokens;
  }
};

// Microbatches that fit one by one but not together: ForwardAllMicrobatches, which keeps every
// microbatch's outputs until it returns, is refused before anything runs, naming the microbatch
// and both amounts; the stream, which hands each back before the next, runs them, and the device
// never goes past the cap. With a cap that fits them together, ForwardAllMicrobatches runs and
// stays under it too.
TEST(TrainerRankTest, AdmissionCountsWhatStaysHeldUntilTheHandBack) {
  // Four microbatches of 8 tokens: alone 1000 + 800 = 1800 each; together, the last one peaks at
  // 1800 + 3 x 320 = 2760.
  const std::vector<planner::Sequence> batch = {
      planner::Sequence::Of(8, 1), planner::Sequence::Of(8, 2), planner::Sequence::Of(8, 3),
      planner::Sequence::Of(8, 4)};
  for (const int64_t cap : {2400, 2800}) {
    SCOPED_TRACE(absl::StrCat("cap ", cap));
    FakeDevice device;
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto streams,
                                  rng::RankStreams::Create(rng::DefaultGenerators::CpuOnly()));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const collectives::Topology topology,
                                  collectives::Topology::CreateExact(1, 1, 1, 1));
    TrainerConfig config = TrainerConfig::Of(8);
    config.plan.packing = planner::PACKING_IN_ORDER;
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(
        admission::MemoryModel peak_only,
        admission::MemoryModel::Of(FakeDevice::kFixed, FakeDevice::kTransient));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(config.memory_model,
                                  peak_only.WithRetained(FakeDevice::kRetained));
    config.memory_cap_bytes = cap;
    auto collaborators = TrainerRank::Collaborators::Of(topology, 0, nullptr, streams);
    collaborators.memory_probe = device.probe;
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(
        auto trainer, TrainerRank::Create(config, collaborators,
                                          [&](const ShardWork& work) -> absl::StatusOr<at::Tensor> {
                                            device.Forward(work.inputs.size(0));
                                            return work.inputs * 2;
                                          }));
    const absl::StatusOr<std::vector<MicrobatchOutput>> all =
        trainer->ForwardAllMicrobatches(TrainerInputs::Of(batch, at::ones({32, 2})));
    if (cap == 2400) {
      EXPECT_EQ(all.status().code(), absl::StatusCode::kResourceExhausted) << all.status();
      EXPECT_THAT(std::string(all.status().message()),
                  AllOf(HasSubstr("microbatch 2"), HasSubstr("on top of"),
                        HasSubstr("each fits alone but not all together")));
      EXPECT_EQ(device.peak, 0) << "a refused call ran forwards";
      // The stream runs them, one hand-back (and release) at a time.
      LOCKSTEP_ASSERT_OK_AND_ASSIGN(
          MicrobatchStream stream,
          trainer->ForwardMicrobatches(TrainerInputs::Of(batch, at::ones({32, 2}))));
      int yielded = 0;
      while (true) {
        LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::optional<MicrobatchOutput> out, stream.Next());
        if (!out) break;
        ++yielded;
        device.held = 0;  // the caller's backward released the microbatch's activations
      }
      EXPECT_EQ(yielded, 4);
    } else {
      LOCKSTEP_ASSERT_OK(all.status());
      EXPECT_EQ(all->size(), 4u);
    }
    EXPECT_LE(device.peak, cap) << "the device went past the cap";
  }
}

}  // namespace
}  // namespace trainer
}  // namespace lockstep
