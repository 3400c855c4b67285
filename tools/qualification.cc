#include "tools/qualification.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <stdexcept>
#include <thread>
#include <utility>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "admission/gradient_staging.h"
#include "admission/ledger.h"
#include "admission/memory_model.h"
#include "admission/qualification/toy_objective.h"
#include "admission/recovery.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/rng_state_saver.h"
#include "collectives/gloo_communicator.h"
#if LOCKSTEP_BUILT_WITH_CUDA
#include "collectives/nccl_communicator.h"
#endif
#include "collectives/rendezvous.h"
#include "nlohmann/json.hpp"
#include "numerics/execution_context.h"
#include "planner/planner.h"
#include "rng/philox.h"
#include "rng/synchronize.h"
#include "tools/launcher.h"
#include "trainer/qualification/oracle.h"

namespace lockstep {
namespace qualification {
namespace {

using collectives::Communicator;
using collectives::Topology;
using nlohmann::json;

at::Tensor CallerDraws() {
  at::Tensor uniform = at::rand({16});
  at::Tensor dropout = at::dropout(at::ones({64}), 0.5, /*train=*/true);
  at::Tensor token_mask = at::randint(0, 2, {32}).to(at::kFloat);
  return at::cat({uniform, dropout, token_mask});
}

// Members of each TP x CP group whose gathered value differs from their leader's.
std::vector<int> DisagreeWithLeader(const Topology& topo, const std::vector<at::Tensor>& values) {
  std::vector<int> bad;
  for (int r = 0; r < topo.world_size(); ++r) {
    if (!at::equal(values[r], values[Topology::Leader(topo.TpCpGroup(r))])) bad.push_back(r);
  }
  return bad;
}

// Puts the caller state the checks start from back in place.
absl::Status Rewind(const RankSetup& setup) {
  if (!setup.synced.has_value()) return absl::FailedPreconditionError("the rank was not set up");
  return setup.synced->Restore();
}

// Runs `work` on the model stream, or — under the unscoped-model-work control — on the caller's.
template <typename Work>
absl::Status OnModelStream(RankSetup& setup, Work&& work) {
  if (setup.control == NegativeControl::kUnscopedModelWork) {
    return CallTorch("model work", std::forward<Work>(work));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(rng::ModelStreamScope scope,
                            rng::ModelStreamScope::Enter(*setup.streams));
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("model work", std::forward<Work>(work)));
  return scope.Exit();
}

// One step of an MLP block with dropout from the synchronized state, plainly and checkpointed;
// the block records the dropout mask of every call (forward, then recompute).
struct RecomputeStep {
  std::vector<at::Tensor> masks;
  at::Tensor x_grad, w1_grad, w2_grad, drawn_between;
  // A pointer, not an optional: GCC 12 at -O2 reports a moved optional<RngSnapshot> as maybe
  // uninitialized.
  std::shared_ptr<const rng::RngSnapshot> after;
};

absl::StatusOr<RecomputeStep> RunRecomputeStep(const RankSetup& setup, bool checkpointed,
                                               const checkpoint::CheckpointOptions& options) {
  RecomputeStep step;
  at::Tensor w1, w2, x;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("making the block's parameters", [&] {
    at::manual_seed(4242);  // the same parameters on every rank
    w1 = (at::randn({32, 64}) * 0.2).requires_grad_();
    w2 = (at::randn({64, 16}) * 0.2).requires_grad_();
  }));
  LOCKSTEP_RETURN_IF_ERROR(Rewind(setup));
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("drawing the input", [&] {
    x = at::randn({8, 32}).requires_grad_();
  }));
  auto block = [&](const std::vector<at::Tensor>& in) {
    at::Tensor h = at::relu(at::matmul(in[0], w1));
    at::Tensor mask = at::bernoulli(at::full_like(h, 0.7));
    step.masks.push_back(mask.detach().clone());
    return std::vector<at::Tensor>{at::matmul(h * mask / 0.7, w2)};
  };
  at::Tensor out;
  if (checkpointed) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> outs,
                              checkpoint::Checkpoint(block, {x}, options));
    out = outs[0];
  } else {
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("running the plain block", [&] { out = block({x})[0]; }));
  }
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("backward of the recompute check", [&] {
    step.drawn_between = at::rand({8});
    (out * at::linspace(-1, 1, out.numel()).reshape(out.sizes())).sum().backward();
    step.x_grad = x.grad();
    step.w1_grad = w1.grad();
    step.w2_grad = w2.grad();
  }));
  LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot after,
                            rng::RngSnapshot::Capture(setup.streams->generators()));
  step.after = std::make_shared<const rng::RngSnapshot>(std::move(after));
  return step;
}

std::string Ranks(const std::vector<int>& ranks) { return absl::StrJoin(ranks, ", "); }

}  // namespace

absl::StatusOr<RankSetup> SetUpRank(Communicator& world, const Topology& topology,
                                    NegativeControl control) {
  RankSetup setup(world, topology);
  setup.control = control;
  const int rank = world.rank();
  LOCKSTEP_ASSIGN_OR_RETURN(setup.tp_cp_group, world.NewGroup(topology.TpCpGroup(rank)));
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
      LOCKSTEP_RETURN_IF_ERROR(rng::Synchronize(setup.tp_cp_group.get(), *setup.streams));
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

absl::StatusOr<CheckResult> CheckReplicaAgreement(RankSetup& setup) {
  LOCKSTEP_RETURN_IF_ERROR(Rewind(setup));
  at::Tensor draws;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("drawing", [&] { draws = CallerDraws(); }));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> all, setup.world->AllGather(draws));
  const std::vector<int> bad = DisagreeWithLeader(setup.topology, all);
  const int leader = Topology::Leader(setup.topology.TpCpGroup(setup.world->rank()));
  return CheckResult::Make(
      "replica_agreement", bad.empty(),
      bad.empty() ? absl::StrCat("replicas match leader ", leader)
                  : absl::StrCat(bad.size(), " rank(s) differ from their leader: ", Ranks(bad)));
}

absl::StatusOr<CheckResult> CheckDpWorkersIndependent(RankSetup& setup) {
  LOCKSTEP_RETURN_IF_ERROR(Rewind(setup));
  at::Tensor draws;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("drawing", [&] { draws = CallerDraws(); }));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> all, setup.world->AllGather(draws));
  const Topology& topo = setup.topology;
  std::vector<int> same;
  for (int d = 1; d < topo.dp_size(); ++d) {
    if (at::equal(all[d * topo.tp_size() * topo.cp_size()], all[0])) same.push_back(d);
  }
  return CheckResult::Make(
      "dp_workers_independent", same.empty(),
      topo.dp_size() == 1 ? "one DP worker"
      : same.empty()      ? absl::StrCat(topo.dp_size(), " DP workers all differ")
                     : absl::StrCat("DP worker(s) ", Ranks(same), " draw what DP worker 0 draws"));
}

absl::StatusOr<CheckResult> CheckModelStream(RankSetup& setup) {
  LOCKSTEP_RETURN_IF_ERROR(Rewind(setup));
  at::Tensor caller_expected;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("drawing", [&] { caller_expected = at::rand({8}); }));
  LOCKSTEP_RETURN_IF_ERROR(Rewind(setup));
  // A fresh model stream, derived from the synchronized caller state.
  LOCKSTEP_RETURN_IF_ERROR(setup.streams->model().Restore(std::nullopt));
  at::Tensor first, second;
  LOCKSTEP_RETURN_IF_ERROR(
      OnModelStream(setup, [&] { first = at::dropout(at::ones({128}), 0.3, true); }));
  LOCKSTEP_RETURN_IF_ERROR(
      OnModelStream(setup, [&] { second = at::dropout(at::ones({128}), 0.3, true); }));
  bool caller_ok = false;
  LOCKSTEP_RETURN_IF_ERROR(
      CallTorch("drawing", [&] { caller_ok = at::equal(at::rand({8}), caller_expected); }));
  const bool advanced = !at::equal(first, second);
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> masks, setup.world->AllGather(first));
  const std::vector<int> bad = DisagreeWithLeader(setup.topology, masks);
  return CheckResult::Make(
      "model_stream", caller_ok && advanced && bad.empty(),
      absl::StrCat(
          "caller ", caller_ok ? "untouched" : "DISTURBED", "; stream ",
          advanced ? "advances" : "REPLAYS", "; ",
          bad.empty() ? "replica masks agree" : absl::StrCat(bad.size(), " replica(s) differ")));
}

absl::StatusOr<CheckResult> CheckExceptionRestoration(RankSetup& setup) {
  LOCKSTEP_RETURN_IF_ERROR(Rewind(setup));
  const absl::Status thrown = OnModelStream(setup, [] {
    (void)at::rand({100});
    throw std::runtime_error("injected");
  });
  if (thrown.ok()) return absl::InternalError("the injected exception was not reported");
  LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot now,
                            rng::RngSnapshot::Capture(setup.streams->generators()));
  const bool restored = now == *setup.synced;
  return CheckResult::Make(
      "exception_restoration", restored,
      restored ? "caller state bit-exact after the throw" : "caller state changed");
}

absl::StatusOr<CheckResult> CheckPartitionInvariance(RankSetup& setup) {
  const Topology& topo = setup.topology;
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::Coordinates c,
                            topo.CoordinatesOf(setup.world->global_ranks()[setup.world->rank()]));
  const int64_t chunk = 3;
  const int64_t tokens = 2 * topo.cp_size() * chunk, cols_per_tp = 5;
  const std::vector<int64_t> shape = {tokens, cols_per_tp * topo.tp_size()};
  const rng::PhiloxKey key{20261129, /*stream=*/1, /*step=*/7};
  auto shard_box = [&](int cp_rank, int tp_rank, int half) {
    const int64_t chunk_index = half == 0 ? cp_rank : 2 * topo.cp_size() - 1 - cp_rank;
    return std::vector<rng::Slice>{{chunk_index * chunk, (chunk_index + 1) * chunk},
                                   {tp_rank * cols_per_tp, (tp_rank + 1) * cols_per_tp}};
  };
  const c10::Device cpu(c10::kCPU);
  // Each rank's two chunks; the shard-local control draws them with local indices, as if each
  // chunk were the whole tensor.
  auto draw = [&](int half) -> absl::StatusOr<at::Tensor> {
    if (setup.control == NegativeControl::kShardLocalPhilox) {
      return rng::PartitionedDropoutMask(key, {chunk, cols_per_tp}, {{0, chunk}, {0, cols_per_tp}},
                                         0.2, cpu);
    }
    return rng::PartitionedDropoutMask(key, shape, shard_box(c.cp, c.tp, half), 0.2, cpu);
  };
  LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor a, draw(0));
  LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor b, draw(1));
  Communicator& group = *setup.tp_cp_group;
  at::Tensor mine;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("joining the shards", [&] {
    mine = at::cat({a, b}, 0).to(at::kByte);
  }));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> shards, group.AllGather(mine));
  at::Tensor assembled;
  LOCKSTEP_RETURN_IF_ERROR(
      CallTorch("allocating", [&] { assembled = at::zeros(shape, at::kByte); }));
  for (int m = 0; m < group.size(); ++m) {
    LOCKSTEP_ASSIGN_OR_RETURN(collectives::Coordinates mc,
                              topo.CoordinatesOf(group.global_ranks()[m]));
    for (int half = 0; half < 2; ++half) {
      const auto box = shard_box(mc.cp, mc.tp, half);
      LOCKSTEP_RETURN_IF_ERROR(CallTorch("reassembling", [&] {
        assembled.slice(0, box[0].begin, box[0].end)
            .slice(1, box[1].begin, box[1].end)
            .copy_(shards[m].slice(0, half * chunk, (half + 1) * chunk));
      }));
    }
  }
  LOCKSTEP_ASSIGN_OR_RETURN(
      at::Tensor full,
      rng::PartitionedDropoutMask(key, shape, {{0, shape[0]}, {0, shape[1]}}, 0.2, cpu));
  const bool equal = at::equal(assembled, full.to(at::kByte));
  return CheckResult::Make(
      "partition_invariance", equal,
      absl::StrCat(group.size(), " shard(s) of a [", shape[0], ", ", shape[1], "] mask ",
                   equal ? "reassemble" : "DO NOT reassemble", " to the unsharded mask"));
}

absl::StatusOr<CheckResult> CheckRecompute(RankSetup& setup) {
  const rng::DefaultGenerators generators = setup.streams->generators();
  checkpoint::CheckpointOptions options;
  if (setup.control == NegativeControl::kAliasingSnapshot) {
    options.rng_streams = std::make_shared<AliasingRngSaver>(generators);
  } else {
    options.rng_streams = checkpoint::StreamSnapshots::Of(setup.streams);
  }
  LOCKSTEP_ASSIGN_OR_RETURN(RecomputeStep plain, RunRecomputeStep(setup, false, options));
  LOCKSTEP_ASSIGN_OR_RETURN(RecomputeStep ckpt, RunRecomputeStep(setup, true, options));
  std::vector<std::string> problems;
  if (ckpt.masks.size() != 2 || !at::equal(ckpt.masks[0], ckpt.masks[1])) {
    problems.push_back("recompute mask != forward mask");
  }
  if (!at::equal(plain.x_grad, ckpt.x_grad)) problems.push_back("input gradient differs");
  if (!at::equal(plain.w1_grad, ckpt.w1_grad) || !at::equal(plain.w2_grad, ckpt.w2_grad)) {
    problems.push_back("parameter gradients differ");
  }
  if (!at::equal(plain.drawn_between, ckpt.drawn_between) || !(*plain.after == *ckpt.after)) {
    problems.push_back("live generator disturbed");
  }
  if (checkpoint::RetainedState().nodes != 0) problems.push_back("state retained");
  at::Tensor flat;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("flattening gradients", [&] {
    flat = at::cat({ckpt.x_grad.flatten(), ckpt.w1_grad.flatten()});
  }));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> grads, setup.world->AllGather(flat));
  const std::vector<int> bad = DisagreeWithLeader(setup.topology, grads);
  if (!bad.empty()) problems.push_back(absl::StrCat(bad.size(), " replica(s) disagree"));
  LOCKSTEP_RETURN_IF_ERROR(Rewind(setup));
  return CheckResult::Make("checkpoint_recompute", problems.empty(),
                           problems.empty() ? "mask replayed; gradients bit-identical to plain; "
                                              "live RNG untouched; 0 retained; replicas agree"
                                            : absl::StrJoin(problems, "; "));
}

namespace {

// A staging that never discards: the double-counted-retry negative control.
class KeepEverythingStaging : public admission::ContributionStaging {
 public:
  absl::Status Begin() override { return absl::OkStatus(); }
  absl::Status Commit() override { return absl::OkStatus(); }
  void Discard() override {}
};

struct ToyStep {
  at::Tensor group_gradient;
  admission::StepReport report;
};

// One step of the toy objective over `plan` on this rank's CP shard, through the recovering
// runner; the victim replica fails its first `failures` attempts after their backward.
absl::StatusOr<ToyStep> RunToyStep(RankSetup& setup, const planner::Plan& plan, int failures,
                                   std::shared_ptr<admission::Ledger> ledger) {
  Communicator& group = *setup.tp_cp_group;
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::Coordinates coordinates,
                            setup.topology.CoordinatesOf(setup.world->rank()));
  const int cp_rank = coordinates.cp;
  const bool victim = group.rank() == group.size() - 1;
  LOCKSTEP_ASSIGN_OR_RETURN(admission::ToyObjective objective,
                            admission::ToyObjective::Create(5, 1));
  LOCKSTEP_ASSIGN_OR_RETURN(admission::MemoryModel model, admission::MemoryModel::Of(1000, 10));
  admission::GradientStaging gradient_staging(objective.parameters());
  KeepEverythingStaging keep_everything;
  admission::ContributionStaging* staging = &gradient_staging;
  if (failures > 0 && setup.control == NegativeControl::kDoubleCountedRetry) {
    staging = &keep_everything;
  }
  admission::RecoveryOptions options;
  options.admission.max_microbatches_per_wave = 1;
  LOCKSTEP_ASSIGN_OR_RETURN(auto runner,
                            admission::RecoveringRunner::Create(
                                admission::RecoveringRunner::Collaborators::Of(&model, staging)
                                    .WithGroup(&group)
                                    .WithLedger(ledger),
                                int64_t{1} << 30, options));
  int failed = 0;
  ToyStep step;
  LOCKSTEP_ASSIGN_OR_RETURN(
      step.report, runner->RunStep(0, plan, [&](const admission::WaveWork& work) -> absl::Status {
        LOCKSTEP_RETURN_IF_ERROR(objective.RunWave(work, cp_rank));
        if (victim && failed < failures) {
          ++failed;
          return absl::ResourceExhaustedError("injected out of memory (qualify --inject_oom)");
        }
        return absl::OkStatus();
      }));
  LOCKSTEP_RETURN_IF_ERROR(runner->CommitStep(0));
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(
      "copying the gradient", [&] { step.group_gradient = objective.weight().grad().clone(); }));
  LOCKSTEP_RETURN_IF_ERROR(group.AllReduceSum(step.group_gradient));
  return step;
}

}  // namespace

absl::StatusOr<CheckResult> CheckOomRecovery(RankSetup& setup) {
  const int world_rank = setup.world->rank();
  std::vector<planner::Sequence> batch;
  const int64_t lengths[] = {40, 12, 64, 7, 33, 50, 20, 9, 61, 3, 27, 64};
  for (int i = 0; i < 12; ++i) batch.push_back(planner::Sequence::Of(lengths[i], 100 + i));
  planner::PlanOptions plan_options;
  plan_options.max_tokens_per_microbatch = 64;
  plan_options.cp_size = setup.topology.cp_size();
  LOCKSTEP_ASSIGN_OR_RETURN(planner::Plan plan, planner::PlanMicrobatches(batch, plan_options));

  LOCKSTEP_ASSIGN_OR_RETURN(ToyStep reference, RunToyStep(setup, plan, 0, nullptr));
  std::string path = absl::StrCat(setup.ledger_dir, "/ledger.rank", world_rank, ".db");
  if (setup.ledger_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    path = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/lockstep_qualify_", getpid(),
                        "_ledger.rank", world_rank, ".db");
  }
  admission::RemoveLedgerFiles(path);
  absl::StatusOr<ToyStep> injected;
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::Coordinates coordinates,
                            setup.topology.CoordinatesOf(world_rank));
  {
    LOCKSTEP_ASSIGN_OR_RETURN(
        std::shared_ptr<admission::Ledger> ledger,
        admission::Ledger::OpenWriter(path, admission::LedgerOptions::Of(coordinates.dp)));
    injected = RunToyStep(setup, plan, setup.inject_oom, ledger);
  }
  if (!injected.ok()) return injected.status();
  LOCKSTEP_ASSIGN_OR_RETURN(admission::LedgerReplay replay, admission::Ledger::Replay(path));
  if (setup.ledger_dir.empty()) {
    admission::RemoveLedgerFiles(path);
  }
  double difference = 0;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("comparing gradients", [&] {
    difference =
        admission::MaxRelativeDifference(injected->group_gradient, reference.group_gradient);
  }));
  std::vector<std::string> problems;
  const admission::StepReport& report = injected->report;
  if (report.out_of_memory != setup.inject_oom) {
    problems.push_back(absl::StrCat(report.out_of_memory, " out-of-memory outcomes seen, ",
                                    setup.inject_oom, " injected"));
  }
  if (!(difference <= 1e-6)) {
    problems.push_back(absl::StrFormat(
        "the group's gradient differs from the run without failures by %.3g (relative; "
        "allowed 1e-6)",
        difference));
  }
  const admission::StepReplay* step = replay.steps.empty() ? nullptr : &replay.steps.front();
  if (step == nullptr || !step->committed || step->completed_tokens != plan.num_tokens() ||
      !step->missing.empty()) {
    problems.push_back("the ledger does not show every token counted once");
  }
  std::string summary = replay.Summary();
  const size_t line = summary.find('\n');
  summary = line == std::string::npos ? summary : summary.substr(line + 1);
  while (!summary.empty() && summary.back() == '\n') summary.pop_back();
  const std::string figures = absl::StrFormat(
      "%d injected on replica %d of the TP x CP group; %d split(s), %d attempts on every "
      "replica; gradient max rel diff %.3g vs the run without failures; ledger: %s",
      setup.inject_oom, setup.tp_cp_group->size() - 1, report.microbatch_splits, report.attempts,
      difference, summary);
  return CheckResult::Make(
      "oom_recovery", problems.empty(),
      problems.empty() ? figures : absl::StrCat(absl::StrJoin(problems, "; "), " (", figures, ")"));
}

absl::StatusOr<std::vector<CheckResult>> CheckTrainer(RankSetup& setup) {
  trainer::OracleControl control = trainer::OracleControl::kNone;
  switch (setup.control) {
    case NegativeControl::kNoSync:
      control = trainer::OracleControl::kNoSync;
      break;
    case NegativeControl::kUnscopedModelWork:
      control = trainer::OracleControl::kUnscopedModelWork;
      break;
    case NegativeControl::kInputInsideScope:
      control = trainer::OracleControl::kInputInsideScope;
      break;
    default:
      break;
  }
  c10::Device device(c10::kCPU);
  if (setup.device == "cuda") {
    if (!at::hasCUDA() || at::getNumGPUs() == 0) {
      return absl::FailedPreconditionError(
          "--device cuda: this build or machine has no CUDA device (build with --config=cuda)");
    }
    device = c10::Device(c10::kCUDA,
                         static_cast<c10::DeviceIndex>(setup.world->rank() % at::getNumGPUs()));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::vector<trainer::OracleCheck> checks,
      trainer::RunTrainerOracle(*setup.world, setup.topology, control, device));
  std::vector<CheckResult> results;
  for (const trainer::OracleCheck& c : checks) {
    results.push_back(CheckResult::Make(c.name, c.passed, c.detail));
  }
  return results;
}

absl::StatusOr<std::vector<CheckResult>> RunRankChecks(Communicator& world,
                                                       const Topology& topology,
                                                       NegativeControl control, int inject_oom,
                                                       const std::string& ledger_dir,
                                                       const std::string& device) {
  LOCKSTEP_ASSIGN_OR_RETURN(RankSetup setup, SetUpRank(world, topology, control));
  setup.inject_oom = inject_oom;
  setup.ledger_dir = ledger_dir;
  setup.device = device;
  std::vector<CheckResult> results;
  using Check = absl::StatusOr<CheckResult> (*)(RankSetup&);
  for (Check check : {&CheckReplicaAgreement, &CheckDpWorkersIndependent, &CheckModelStream,
                      &CheckExceptionRestoration, &CheckPartitionInvariance, &CheckRecompute,
                      &CheckOomRecovery}) {
    LOCKSTEP_ASSIGN_OR_RETURN(CheckResult result, check(setup));
    LOCKSTEP_VLOG(1) << "rank " << world.rank() << ": " << result.name << " "
                     << (result.passed ? "PASS" : "FAIL") << " (" << result.detail << ")";
    results.push_back(std::move(result));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<CheckResult> trainer_checks, CheckTrainer(setup));
  for (CheckResult& result : trainer_checks) {
    LOCKSTEP_VLOG(1) << "rank " << world.rank() << ": " << result.name << " "
                     << (result.passed ? "PASS" : "FAIL") << " (" << result.detail << ")";
    results.push_back(std::move(result));
  }
  LOCKSTEP_RETURN_IF_ERROR(world.Barrier());
  return results;
}

absl::Status ValidateQualifyOptions(const QualifyOptions& options) {
  for (const auto& [flag, value] : {std::pair<const char*, int>{"--dp", options.dp},
                                    {"--tp", options.tp},
                                    {"--cp", options.cp}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " ", value, " is not a positive integer"));
    }
    if (value > kMaxQualifyWorld) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " ", value,
                                                     " exceeds qualify's world limit of ",
                                                     kMaxQualifyWorld, " local processes"));
    }
  }
  const int64_t world = int64_t{options.dp} * options.tp * options.cp;
  if (world > kMaxQualifyWorld) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dp ", options.dp, " x --tp ", options.tp, " x --cp ", options.cp, " = ", world,
        " processes exceeds qualify's limit of ", kMaxQualifyWorld, " local processes"));
  }
  if (options.device != "cpu" && options.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device '", options.device, "' is neither cpu nor cuda"));
  }
  if (options.inject_oom < 0 || options.inject_oom > kMaxInjectedOom) {
    return absl::InvalidArgumentError(absl::StrCat("--inject_oom ", options.inject_oom,
                                                   " is outside [0, ", kMaxInjectedOom, "]"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--timeout_seconds ", absl::FormatDuration(options.timeout), " must be positive"));
  }
  if (options.deadline.has_value() && *options.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--deadline_seconds ", absl::FormatDuration(*options.deadline), " must be positive"));
  }
  return absl::OkStatus();
}

absl::Duration DefaultDeadline(absl::Duration timeout) { return 3 * timeout + absl::Seconds(60); }

absl::Status ValidateQualifyMachine(const QualifyOptions& options, int cores,
                                    int64_t available_bytes) {
  const int64_t world = int64_t{options.dp} * options.tp * options.cp;
  const std::string flags = absl::StrCat("--dp ", options.dp, " x --tp ", options.tp, " x --cp ",
                                         options.cp, " = ", world, " worker processes");
  if (world > int64_t{kProcessesPerCore} * std::max(cores, 1)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        flags, " exceed ", kProcessesPerCore, " per core on this machine's ", cores, " core(s)"));
  }
  if (available_bytes >= 0 && world * kBytesPerWorker > available_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        flags, " need ", (world * kBytesPerWorker) >> 20, " MiB (", kBytesPerWorker >> 20,
        " MiB each); this machine has ", available_bytes >> 20, " MiB available"));
  }
  return absl::OkStatus();
}

int RunWorker(int dp, int tp, int cp, NegativeControl control, absl::Duration timeout,
              const std::string& results_dir, int inject_oom, const std::string& device) {
  at::set_num_threads(1);
  json report;
  const absl::Status status = [&]() -> absl::Status {
    LOCKSTEP_ASSIGN_OR_RETURN(auto rendezvous, collectives::Rendezvous::FromEnvironment(timeout));
    std::unique_ptr<Communicator> world;
    std::string transport = "gloo";
#if LOCKSTEP_BUILT_WITH_CUDA
    // --device cuda with a GPU for every rank: NCCL, one GPU per rank (its local rank).
    if (device == "cuda" && at::hasCUDA() &&
        static_cast<int64_t>(at::getNumGPUs()) >= rendezvous->world_size()) {
      collectives::NcclCommunicator::Options options;
      options.timeout = timeout;
      LOCKSTEP_ASSIGN_OR_RETURN(world, collectives::NcclCommunicator::Create(rendezvous, options));
      transport = "nccl";
    }
#endif
    if (world == nullptr) {
      collectives::GlooCommunicator::Options options;
      options.timeout = timeout;
      LOCKSTEP_ASSIGN_OR_RETURN(world, collectives::GlooCommunicator::Create(rendezvous, options));
    }
    report["transport"] = transport;
    LOCKSTEP_ASSIGN_OR_RETURN(Topology topo, Topology::CreateExact(world->size(), dp, tp, cp));
    report["rank"] = world->rank();
    LOCKSTEP_ASSIGN_OR_RETURN(
        std::vector<CheckResult> results,
        RunRankChecks(*world, topo, control, inject_oom, results_dir, device));
    for (const CheckResult& r : results) {
      report["checks"].push_back({{"name", r.name}, {"passed", r.passed}, {"detail", r.detail}});
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) report["error"] = status.ToString();
  const char* rank = std::getenv("RANK");
  std::ofstream(absl::StrCat(results_dir, "/rank", rank != nullptr ? rank : "0", ".json"))
      << report.dump(2);
  if (!status.ok()) {
    LOCKSTEP_LOG(ERROR) << "qualify worker: " << status;
    return 1;
  }
  return 0;
}

namespace {

// Removes a directory's files and then the directory (best effort).
void RemoveDirectory(const std::string& dir, int world) {
  for (int r = 0; r < world; ++r) {
    std::remove(absl::StrCat(dir, "/rank", r, ".json").c_str());
    admission::RemoveLedgerFiles(absl::StrCat(dir, "/ledger.rank", r, ".db"));
  }
  std::remove(absl::StrCat(dir, "/workers.log").c_str());
  rmdir(dir.c_str());
}

}  // namespace

namespace {

// MemAvailable of /proc/meminfo in bytes, or -1 when it cannot be read.
int64_t AvailableMemory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

}  // namespace

absl::StatusOr<bool> RunQualify(const QualifyOptions& options, std::ostream& out) {
  LOCKSTEP_RETURN_IF_ERROR(ValidateQualifyOptions(options));
  LOCKSTEP_RETURN_IF_ERROR(ValidateQualifyMachine(
      options, static_cast<int>(std::thread::hardware_concurrency()), AvailableMemory()));
  const int world = options.dp * options.tp * options.cp;
  if (!options.evidence_path.empty()) {
    // Fail before the job runs, not after it.
    std::ofstream probe(options.evidence_path, std::ios::app);
    if (!probe) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot write the evidence file '", options.evidence_path, "': ", std::strerror(errno)));
    }
  }
  char dir_template[] = "/tmp/qualify.XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
  }
  const std::string dir = dir_template;
  const std::string log_path = absl::StrCat(dir, "/workers.log");
  FILE* log = std::fopen(log_path.c_str(), "w");
  if (log == nullptr) {
    const absl::Status error =
        absl::InternalError(absl::StrCat(log_path, ": ", std::strerror(errno)));
    RemoveDirectory(dir, world);
    return error;
  }
  tools::LaunchOptions launch;
  launch.nproc = world;
  launch.output_fd = fileno(log);
  launch.deadline = options.deadline.value_or(DefaultDeadline(options.timeout));
  launch.command = {options.executable,
                    "--worker",
                    absl::StrCat("--dp=", options.dp),
                    absl::StrCat("--tp=", options.tp),
                    absl::StrCat("--cp=", options.cp),
                    absl::StrCat("--results_dir=", dir),
                    absl::StrCat("--timeout_seconds=", absl::ToInt64Seconds(options.timeout)),
                    absl::StrCat("--negative_control=", NegativeControlName(options.control)),
                    absl::StrCat("--inject_oom=", options.inject_oom),
                    absl::StrCat("--device=", options.device)};
  const std::string topology =
      absl::StrCat("DP", options.dp, " x TP", options.tp, " x CP", options.cp);
  out << "qualify: " << topology << " (" << world << " local processes"
      << (options.device == "cuda"
              ? "; the trainer oracle on CUDA, over NCCL when there is a GPU per rank, else Gloo"
              : " over Gloo")
      << ")"
      << (options.control == NegativeControl::kNone
              ? ""
              : "  negative control: " + NegativeControlName(options.control))
      << std::endl;
  LOCKSTEP_VLOG(1) << "qualify: launching " << world << " workers; their output goes to "
                   << log_path;
  absl::StatusOr<tools::LaunchResult> launched = tools::Launch(launch);
  std::fclose(log);
  if (launched.ok()) LOCKSTEP_VLOG(1) << "qualify: workers done: " << launched->summary;
  if (!launched.ok()) {
    RemoveDirectory(dir, world);
    return launched.status();
  }

  // check name -> per-rank (passed, detail)
  std::vector<std::string> order;
  std::map<std::string, std::vector<json>> per_check;
  std::vector<std::string> errors;
  std::string transport = "unknown";
  for (int r = 0; r < world; ++r) {
    std::ifstream in(absl::StrCat(dir, "/rank", r, ".json"));
    // A rank stopped mid-write leaves an empty or truncated file: report it, do not throw.
    const json report = in ? json::parse(in, nullptr, /*allow_exceptions=*/false) : json();
    if (!in || report.is_discarded() || !report.is_object()) {
      errors.push_back(absl::StrCat("rank ", r, " wrote no report"));
      continue;
    }
    if (r == 0 && report.contains("transport") && report["transport"].is_string()) {
      transport = report["transport"].get<std::string>();
    }
    if (report.contains("error") && report["error"].is_string()) {
      errors.push_back(absl::StrCat("rank ", r, ": ", report["error"].get<std::string>()));
    }
    for (const json& check : report.value("checks", json::array())) {
      if (!check.is_object() || !check.contains("name") || !check["name"].is_string()) continue;
      const std::string name = check["name"];
      if (!per_check.count(name)) order.push_back(name);
      json entry = check;
      entry["rank"] = r;
      per_check[name].push_back(entry);
    }
  }

  out << "transport: " << transport << "\n\n"
      << absl::StrFormat("%-24s %-6s %-7s %s\n", "check", "result", "ranks", "detail (rank 0)");
  bool all_passed = errors.empty() && launched->exit_code == 0 && !order.empty();
  json evidence;
  evidence["topology"] = {
      {"dp", options.dp}, {"tp", options.tp}, {"cp", options.cp}, {"world", world}};
  evidence["negative_control"] = NegativeControlName(options.control);
  evidence["device"] = options.device;
  evidence["transport"] = transport;
  evidence["context"] = numerics::CaptureExecutionContext(
      {{"topology", topology}, {"negative_control", NegativeControlName(options.control)}});
  for (const std::string& name : order) {
    int passed = 0;
    for (const json& e : per_check[name]) passed += e.value("passed", false) ? 1 : 0;
    const bool ok = passed == world;
    all_passed = all_passed && ok;
    out << absl::StrFormat("%-24s %-6s %d/%-5d %s\n", name, ok ? "PASS" : "FAIL", passed, world,
                           per_check[name][0].value("detail", std::string()));
    evidence["checks"].push_back({{"name", name}, {"passed", ok}, {"ranks", per_check[name]}});
  }
  for (const std::string& e : errors) out << "error: " << e << "\n";
  if (launched->exit_code != 0) {
    out << "launch: " << launched->summary << " (worker output in " << log_path << ")\n";
  }
  if (!launched->stalled_ranks.empty()) {
    evidence["stalled_ranks"] = launched->stalled_ranks;
  }
  evidence["errors"] = errors;
  evidence["passed"] = all_passed;
  out << "\n" << (all_passed ? "PASS" : "FAIL") << ": " << topology << "\n";
  if (!options.evidence_path.empty()) {
    std::ofstream file(options.evidence_path, std::ios::trunc);
    file << evidence.dump(2) << "\n";
    if (!file) {
      return absl::InternalError(
          absl::StrCat("cannot write the evidence file '", options.evidence_path,
                       "' (per-rank reports and worker output kept in ", dir, ")"));
    }
    out << "evidence: " << options.evidence_path << "\n";
  }
  if (all_passed) {
    // Keep the per-rank reports and worker log only when something needs looking into.
    RemoveDirectory(dir, world);
  } else {
    out << "per-rank reports and worker output: " << dir << "\n";
  }
  return all_passed;
}

}  // namespace qualification
}  // namespace lockstep
