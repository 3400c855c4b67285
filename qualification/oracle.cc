#include "qualification/oracle.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/temp_dir.h"
#include "base/torch_boundary.h"
#include "collectives/rank_groups.h"
#include "numerics/compare.h"
#include "planner/planner.h"
#include "qualification/internal/oracle_compare.h"
#include "qualification/internal/row_owners.h"
#include "qualification/reference_model.h"
#include "rng/model_stream.h"
#include "rng/snapshot.h"
#include "torch/optim/adam.h"
#include "trainer/internal/contract_seams.h"
#include "trainer/trainer_rank.h"

namespace lockstep {
namespace qualification {
namespace {

using internal::AllEqualAcross;
using internal::CompareLists;
using internal::Figures;

using collectives::Communicator;
using collectives::Topology;

constexpr int kSteps = 2;
constexpr int kForwardsPerStep = 2;
constexpr int64_t kBudget = 48;
// The named stream the reference model draws from (the same seed on every rank).
constexpr char kNamedStream[] = "reference-model";
constexpr uint64_t kNamedStreamSeed = 4242;

// The SHA-256 of `state`'s bytes, as a byte tensor.
at::Tensor StateDigest(const rng::RngSnapshot& state) {
  std::string bytes = state.cpu_state();
  if (state.cuda().has_value()) {
    absl::StrAppend(&bytes, "/", state.cuda()->seed, "/", state.cuda()->offset);
  }
  const Sha256Digest digest = Sha256Framed({bytes});
  at::Tensor t = at::empty({static_cast<int64_t>(digest.size())}, at::kByte);
  std::memcpy(t.data_ptr<uint8_t>(), digest.data(), digest.size());
  return t;
}

// Who runs: the split rank, or its unsplit reference.
struct RunSetup {
  const Topology* topology = nullptr;
  int world_rank = 0;
  int dp_index = 0;
  int64_t seed = 0;
  int tp_rank = 0, tp_size = 1;
  std::shared_ptr<Communicator> tp_cp;
  Communicator* tp = nullptr;
  Communicator* cp = nullptr;
  Communicator* dp = nullptr;
  NegativeControl control = NegativeControl::kNone;
  c10::Device device = c10::Device(c10::kCPU);
  // Activation checkpointing of the model's blocks (the split run; the reference runs without,
  // so matching it shows the recompute replays the forward exactly).
  bool checkpoint_blocks = false;
};

struct RunRecord {
  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> masks;
  // Right after every hand-back: the SHA-256 of the caller's state (a byte tensor each).
  std::vector<at::Tensor> caller_states;
  // Per step: gradients of the model's parameters (this rank's TP shard of each) and the head,
  // summed over CP and DP, in the order of `names`.
  std::vector<std::vector<at::Tensor>> gradients;
  std::vector<at::Tensor> parameters;
  std::vector<std::string> names;
  int tp_rank = 0, tp_size = 1;
  int hand_backs = 0;
  std::vector<std::string> caller_moved;
  int model_stream_still = 0;
  // Indices into `outputs` of the microbatches that left a CP rank without tokens.
  std::vector<size_t> empty_shard_outputs;
  // Per hand-back: the digests of the rows computed and received (Note [Rows against their
  // owners] in internal/row_owners.h).
  std::vector<at::Tensor> row_digests;
};

std::vector<planner::Sequence> Batch(int step, int forward, int dp_index) {
  const int64_t lengths[] = {20 + 3 * step + forward, 13 + dp_index, kBudget, 1};
  std::vector<planner::Sequence> batch;
  for (int i = 0; i < 4; ++i) {
    batch.push_back(
        planner::Sequence::Of(lengths[i], dp_index * 1000 + step * 100 + forward * 10 + i));
  }
  return batch;
}

// Trains steps [first_step, kSteps). With `save_dir`, saves the state (RNG streams included)
// after step 0; with `load_dir`, loads a saved state first.
//
// Long on purpose: this is the training program the oracle proves, written top to bottom as a
// user's loop reads (streams, model, trainer, head, optimizer, then per step: inputs, forward,
// hand-back checks, backward, reduction, update, save), so that the controls planted in it sit
// where a user's bug would; its lambdas share the one RunRecord they fill.
absl::StatusOr<RunRecord> Train(const RunSetup& setup, int first_step = 0,
                                const std::string& save_dir = "",
                                const std::string& load_dir = "") {
  RunRecord record;
  std::shared_ptr<rng::RankStreams> streams;
  const c10::Device device = setup.device;
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  LOCKSTEP_ASSIGN_OR_RETURN(
      streams, rng::RankStreams::Create(device.is_cuda()
                                            ? rng::DefaultGenerators::WithCudaDevice(device.index())
                                            : rng::DefaultGenerators::CpuOnly()));
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("seeding", [&] { at::manual_seed(setup.seed); }));
  LOCKSTEP_RETURN_IF_ERROR(streams->named().Add(kNamedStream, kNamedStreamSeed));
  LOCKSTEP_ASSIGN_OR_RETURN(
      ReferenceModel model,
      ReferenceModel::Create(setup.tp_rank, setup.tp_size, setup.tp, setup.cp, device));
  model.DrawFromNamedStream(streams, kNamedStream);
  // The split-arithmetic controls are planted in the model, in the reference run too (where they
  // change nothing): a difference is the split's.
  if (setup.control == NegativeControl::kCpLocalAttention) {
    model.BreakSplitArithmetic(ReferenceModel::SplitBug::kCpLocalAttention);
  }
  if (setup.control == NegativeControl::kTpUnreducedGradient) {
    model.BreakSplitArithmetic(ReferenceModel::SplitBug::kTpUnreducedGradient);
  }
  record.tp_rank = setup.tp_rank;
  record.tp_size = setup.tp_size;
  trainer::TrainerConfig config = trainer::TrainerConfig::Of(kBudget);
  config.plan.packing = planner::PACKING_IN_ORDER;
  config.activation_checkpointing = setup.checkpoint_blocks;
  const trainer::internal::ContractSeams seams = TrainerSeamsFor(setup.control);
  // Note [Rows against their owners]: each forward's rows, digested before the gather.
  internal::RowOwnership owners;
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::unique_ptr<trainer::TrainerRank> trainer,
      trainer::internal::CreateWithSeams(
          config,
          trainer::TrainerRank::Collaborators::Of(*setup.topology, setup.world_rank, setup.tp_cp,
                                                  streams),
          owners.Wrap([&model](const trainer::ShardWork& work) { return model.Forward(work); }),
          seams));
  LOCKSTEP_ASSIGN_OR_RETURN(
      numerics::NamedTensors head,
      trainer->RegisterCustomObject(
          "loss_head", "linear 8 -> 1, no bias",
          [&f32]() -> absl::StatusOr<numerics::NamedTensors> {
            at::Tensor w;
            LOCKSTEP_RETURN_IF_ERROR(CallTorch("head", [&] {
              w = (0.2 * at::randn({1, ReferenceModel::kWidth}, f32)).set_requires_grad(true);
            }));
            return numerics::NamedTensors{{"w", w}};
          }));
  numerics::NamedTensors named = model.parameters();
  named.emplace_back("head", head[0].second);
  std::vector<at::Tensor> parameters;
  for (const auto& [name, tensor] : named) {
    record.names.push_back(name);
    parameters.push_back(tensor);
  }
  std::unique_ptr<torch::optim::Adam> adam;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("creating Adam", [&] {
    adam = std::make_unique<torch::optim::Adam>(parameters, torch::optim::AdamOptions(0.05));
  }));

  const bool leader = setup.tp_cp == nullptr || setup.tp_cp->rank() == 0;
  auto caller_state = [&]() { return rng::RngSnapshot::Capture(streams->generators()); };
  // The loss of one microbatch's outputs, with a token mask the caller draws now; first the
  // digests of the rows received (Note [Rows against their owners]).
  auto backward = [&](const trainer::MicrobatchOutput& out) -> absl::Status {
    LOCKSTEP_RETURN_IF_ERROR(owners.Received(out));
    return CallTorch("caller loss and backward", [&] {
      at::Tensor mask = at::bernoulli(at::full({out.outputs.size(0)}, 0.8, f32));
      at::Tensor z = at::mm(out.outputs, head[0].second.t()).squeeze(1);
      at::Tensor loss = (out.loss_weights.to(f32) * mask * z * z).sum();
      loss.backward();
      record.outputs.push_back(out.outputs.detach().clone());
      record.masks.push_back(mask);
    });
  };
  // Between hand-backs the replicas' draws diverge: the leader draws one more sample (as a leader
  // that logs one does), after the call's inputs are drawn and before each hand-back, which must
  // make them agree again.
  auto diverge = [&]() -> absl::Status {
    if (!leader) return absl::OkStatus();
    return CallTorch("the leader's own draw", [&] { (void)at::rand({3}, f32); });
  };
  auto check_hand_back = [&](const rng::RngSnapshot& before,
                             const std::optional<rng::RngSnapshot>& model_before,
                             const std::string& where) -> absl::Status {
    LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot after, caller_state());
    ++record.hand_backs;
    LOCKSTEP_RETURN_IF_ERROR(CallTorch(
        "the caller state's digest", [&] { record.caller_states.push_back(StateDigest(after)); }));
    if (leader && !(after == before)) record.caller_moved.push_back(where);
    if (streams->model().state() == model_before) ++record.model_stream_still;
    return absl::OkStatus();
  };

  if (!load_dir.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(const rng::RngSnapshot fresh_caller, caller_state());
    LOCKSTEP_ASSIGN_OR_RETURN(trainer::LoadReport loaded,
                              trainer->LoadState(load_dir, named, adam.get()));
    if (loaded.weights != static_cast<int>(named.size()) || !loaded.optimizer ||
        !loaded.rng_streams) {
      return absl::InternalError("the saved state was not restored in full");
    }
    if (setup.control == NegativeControl::kResumeWithoutNamedStreams) {
      // The bug: the named streams start afresh instead of where the saved run left them.
      LOCKSTEP_RETURN_IF_ERROR(streams->named().Reset());
      LOCKSTEP_RETURN_IF_ERROR(streams->named().Add(kNamedStream, kNamedStreamSeed));
    }
    if (setup.control == NegativeControl::kResumeWithoutCallerStream) {
      // The bug: the caller's generators as the new process had them.
      LOCKSTEP_RETURN_IF_ERROR(fresh_caller.Restore());
    }
    if (setup.control == NegativeControl::kResumeWithoutModelStream) {
      // The bug: the model stream derived afresh at the next scope.
      LOCKSTEP_RETURN_IF_ERROR(streams->model().Restore(std::nullopt));
    }
    if (setup.control == NegativeControl::kResumeWithoutOptimizer) {
      // The bug: Adam's moments and step counts dropped.
      LOCKSTEP_RETURN_IF_ERROR(CallTorch("dropping Adam's state", [&] { adam->state().clear(); }));
    }
  }
  for (int step = first_step; step < kSteps; ++step) {
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("zeroing gradients", [&] { adam->zero_grad(); }));
    for (int forward = 0; forward < kForwardsPerStep; ++forward) {
      std::vector<planner::Sequence> batch = Batch(step, forward, setup.dp_index);
      int64_t tokens = 0;
      for (const planner::Sequence& s : batch) tokens += s.num_tokens;
      at::Tensor rows;
      if (setup.control == NegativeControl::kInputInsideScope) {
        // The bug: the caller's inputs drawn on the model stream.
        LOCKSTEP_ASSIGN_OR_RETURN(rng::ModelStreamScope scope,
                                  rng::ModelStreamScope::Enter(*streams));
        LOCKSTEP_RETURN_IF_ERROR(CallTorch("inputs", [&] {
          rows = at::randint(ReferenceModel::kVocab, {tokens}, f32.dtype(at::kLong));
        }));
        LOCKSTEP_RETURN_IF_ERROR(scope.Exit());
      } else {
        LOCKSTEP_RETURN_IF_ERROR(CallTorch("inputs", [&] {
          rows = at::randint(ReferenceModel::kVocab, {tokens}, f32.dtype(at::kLong));
        }));
      }
      trainer::TrainerInputs inputs = trainer::TrainerInputs::Of(batch, rows);
      const std::string where = absl::StrCat("step ", step, " forward ", forward);
      if (forward == 0) {
        LOCKSTEP_ASSIGN_OR_RETURN(trainer::MicrobatchStream stream,
                                  trainer->ForwardMicrobatches(std::move(inputs)));
        for (int m = 0;; ++m) {
          if (m < stream.plan().microbatches_size()) LOCKSTEP_RETURN_IF_ERROR(diverge());
          LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot before, caller_state());
          const std::optional<rng::RngSnapshot> model_before = streams->model().state();
          LOCKSTEP_ASSIGN_OR_RETURN(std::optional<trainer::MicrobatchOutput> out, stream.Next());
          if (!out.has_value()) break;
          LOCKSTEP_RETURN_IF_ERROR(
              check_hand_back(before, model_before, absl::StrCat(where, " microbatch ", m)));
          if (stream.plan().microbatches(out->microbatch).num_tokens() <
              setup.topology->cp_size()) {
            record.empty_shard_outputs.push_back(record.outputs.size());
          }
          LOCKSTEP_RETURN_IF_ERROR(backward(*out));
        }
      } else {
        LOCKSTEP_RETURN_IF_ERROR(diverge());
        LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot before, caller_state());
        const std::optional<rng::RngSnapshot> model_before = streams->model().state();
        LOCKSTEP_ASSIGN_OR_RETURN(std::vector<trainer::MicrobatchOutput> outs,
                                  trainer->ForwardAllMicrobatches(std::move(inputs)));
        LOCKSTEP_RETURN_IF_ERROR(check_hand_back(before, model_before, where));
        for (const trainer::MicrobatchOutput& out : outs) LOCKSTEP_RETURN_IF_ERROR(backward(out));
      }
    }
    // The caller's gradient reduction: the model's parameters over CP (each CP rank
    // back-propagated its own tokens; the head saw every token's output on every replica),
    // everything over DP.
    std::vector<at::Tensor> grads;
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("reading gradients", [&] {
      for (const at::Tensor& p : parameters) {
        if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
        grads.push_back(p.grad());
      }
    }));
    if (setup.cp != nullptr) {
      for (size_t i = 0; i + 1 < grads.size(); ++i) {
        LOCKSTEP_RETURN_IF_ERROR(setup.cp->AllReduceSum(grads[i]));
      }
    }
    if (setup.dp != nullptr) {
      for (at::Tensor& g : grads) LOCKSTEP_RETURN_IF_ERROR(setup.dp->AllReduceSum(g));
    }
    std::vector<at::Tensor> copies;
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("Adam step", [&] {
      for (const at::Tensor& g : grads) copies.push_back(g.clone());
      adam->step();
    }));
    record.gradients.push_back(std::move(copies));
    if (step == 0 && !save_dir.empty()) {
      trainer::SaveOptions options;
      options.include_rng_streams = true;
      LOCKSTEP_RETURN_IF_ERROR(trainer->SaveState(save_dir, named, adam.get(), options));
    }
  }
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("final parameters", [&] {
    for (const at::Tensor& p : parameters) record.parameters.push_back(p.detach().clone());
  }));
  record.row_digests = owners.digests();
  return record;
}

// The part of each tensor of the unsplit reference's list (in the order of `names`) that a rank
// of TP rank `tp_rank` of `tp_size` holds.
absl::StatusOr<std::vector<at::Tensor>> ShardsOf(const std::vector<at::Tensor>& full,
                                                 const std::vector<std::string>& names, int tp_rank,
                                                 int tp_size) {
  if (full.size() != names.size()) {
    return absl::InternalError(
        absl::StrCat("the reference has ", full.size(), " tensors, the run ", names.size()));
  }
  std::vector<at::Tensor> shards;
  for (size_t i = 0; i < full.size(); ++i) {
    LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor shard,
                              ReferenceModel::ShardOf(names[i], full[i], tp_rank, tp_size));
    shards.push_back(std::move(shard));
  }
  return shards;
}

OracleCheck Check(std::string name, bool passed, std::string detail) {
  OracleCheck check;
  check.name = std::move(name);
  check.passed = passed;
  check.detail = std::move(detail);
  return check;
}

}  // namespace

// Long on purpose: the runs (split, resumed, the unsplit reference) and then every check over
// them, in the order the header lists the checks, each one's verdict and detail side by side.
absl::StatusOr<std::vector<OracleCheck>> RunTrainerOracle(Communicator& world,
                                                          const Topology& topology,
                                                          NegativeControl control,
                                                          c10::Device device) {
  const int rank = world.rank();
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::RankGroups groups,
                            collectives::RankGroups::CreateBorrowing(world, topology));
  const collectives::Coordinates me = groups.coordinates();
  const std::shared_ptr<Communicator>& tp_cp = groups.tp_cp();
  const int leader = groups.replica_leader();

  RunSetup split;
  split.topology = &topology;
  split.world_rank = rank;
  split.dp_index = me.dp;
  split.seed = 1000 + rank;  // every rank differently seeded, as after independent data loading
  split.tp_rank = me.tp;
  split.tp_size = topology.tp_size();
  split.tp_cp = tp_cp;
  split.tp = groups.tp_or_null();
  split.cp = groups.cp_or_null();
  split.dp = groups.dp_or_null();
  split.control = control;
  split.device = device;
  split.checkpoint_blocks = true;
  // The saved state in a directory of this rank's own (TempDir: removed on every path).
  LOCKSTEP_ASSIGN_OR_RETURN(TempDir state_dir, TempDir::Make(absl::StrCat("oracle_rank", rank)));
  const std::string saved = state_dir.path() + "/after_step0";
  LOCKSTEP_ASSIGN_OR_RETURN(RunRecord run, Train(split, 0, saved));
  // A restart from the state saved after step 0 continues bit-exactly.
  LOCKSTEP_ASSIGN_OR_RETURN(RunRecord resumed_run, Train(split, 1, "", saved));
  const RunRecord* resumed = &resumed_run;

  // The unsplit reference of this rank's DP worker, from its leader's state.
  LOCKSTEP_ASSIGN_OR_RETURN(Topology unsplit, Topology::CreateExact(1, 1, 1, 1));
  RunSetup reference;
  reference.topology = &unsplit;
  reference.world_rank = 0;
  reference.dp_index = me.dp;
  reference.seed = 1000 + leader;
  reference.dp = split.dp;
  reference.device = device;
  if (control == NegativeControl::kCpLocalAttention ||
      control == NegativeControl::kTpUnreducedGradient) {
    reference.control = control;  // planted in the reference too (a no-op there)
  }
  LOCKSTEP_ASSIGN_OR_RETURN(RunRecord expected, Train(reference));

  std::vector<OracleCheck> checks;
  int disagreeing = 0;
  LOCKSTEP_ASSIGN_OR_RETURN(
      const std::string misrouted,
      internal::RowsDisagreeWithOwners(tp_cp.get(), topology, run.row_digests));
  checks.push_back(Check(
      "replica_outputs", misrouted.empty(),
      misrouted.empty()
          ? absl::StrCat(run.row_digests.size(), " hand-backs: every one of the ",
                         tp_cp == nullptr ? 1 : tp_cp->size(),
                         " replicas received each CP rank's rows bit-identical to what that CP "
                         "rank computed")
          : misrouted));
  LOCKSTEP_ASSIGN_OR_RETURN(bool masks_agree, AllEqualAcross(tp_cp.get(), run.masks, &disagreeing));
  const int masks_disagreeing = disagreeing;
  LOCKSTEP_ASSIGN_OR_RETURN(bool states_agree,
                            AllEqualAcross(tp_cp.get(), run.caller_states, &disagreeing));
  const int states_disagreeing = disagreeing;
  // DP workers, seeded differently, must stay distinct: no two share their first hand-back's
  // caller state.
  bool dp_distinct = true;
  if (split.dp != nullptr && !run.caller_states.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> workers,
                              split.dp->AllGather(run.caller_states.front()));
    for (size_t a = 0; a < workers.size(); ++a) {
      for (size_t b = a + 1; b < workers.size(); ++b) {
        if (at::equal(workers[a], workers[b])) dp_distinct = false;
      }
    }
  }
  const bool draws_ok = masks_agree && states_agree && dp_distinct;
  checks.push_back(Check(
      "caller_draws", draws_ok,
      draws_ok ? absl::StrCat("after every one of ", run.caller_states.size(),
                              " hand-backs the replicas' caller states are bit-identical (the "
                              "leader drew more between them) and ",
                              run.masks.size(), " token masks agree",
                              split.dp != nullptr ? "; DP workers stay distinct" : "")
               : absl::StrCat(states_disagreeing,
                              " replica(s) held another caller state right after a hand-back, ",
                              masks_disagreeing, " drew other token masks",
                              dp_distinct ? "" : "; DP workers' caller states became equal")));
  const bool progression = run.caller_moved.empty() && run.model_stream_still == 0;
  checks.push_back(Check(
      "stream_progression", progression,
      progression ? absl::StrCat(run.hand_backs,
                                 " hand-backs: the caller's generator untouched by "
                                 "model work, the model stream advanced each time")
                  : absl::StrCat(run.caller_moved.size(),
                                 " hand-back(s) moved the caller's "
                                 "generator (first: ",
                                 run.caller_moved.empty() ? "none" : run.caller_moved[0], "); ",
                                 run.model_stream_still, " left the model stream where it was")));

  const numerics::Tolerance tolerance;
  Figures figures;
  std::vector<std::string> failures;
  LOCKSTEP_RETURN_IF_ERROR(
      CompareLists(run.outputs, expected.outputs, "outputs", tolerance, figures, failures));
  LOCKSTEP_RETURN_IF_ERROR(CompareLists(run.masks, expected.masks, "token mask",
                                        numerics::Tolerance::Bitwise(), figures, failures));
  for (int step = 0; step < kSteps && step < static_cast<int>(expected.gradients.size()); ++step) {
    LOCKSTEP_ASSIGN_OR_RETURN(
        std::vector<at::Tensor> expected_gradients,
        ShardsOf(expected.gradients[step], run.names, run.tp_rank, run.tp_size));
    LOCKSTEP_RETURN_IF_ERROR(CompareLists(run.gradients[step], expected_gradients,
                                          absl::StrCat("step ", step, " gradient"), tolerance,
                                          figures, failures));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> expected_parameters,
                            ShardsOf(expected.parameters, run.names, run.tp_rank, run.tp_size));
  LOCKSTEP_RETURN_IF_ERROR(CompareLists(run.parameters, expected_parameters,
                                        "parameters after 2 Adam steps", tolerance, figures,
                                        failures));
  checks.push_back(Check(
      "reference_match", failures.empty(),
      failures.empty()
          ? absl::StrCat(run.outputs.size(), " microbatches' outputs, ", run.masks.size(),
                         " masks (bitwise), gradients of ", kSteps, " steps x ", kForwardsPerStep,
                         " accumulated forwards and the parameters after ", kSteps,
                         " Adam steps match the unsplit reference (default "
                         "tolerance; ",
                         figures.compared, " tensors, ", figures.bitwise_equal,
                         " bit-identical, max |diff| ",
                         absl::StrFormat("%.3g", figures.max_abs_diff), ", max relative L2 ",
                         absl::StrFormat("%.3g", figures.max_relative_l2), ")")
          : absl::StrCat(failures.size(), " mismatch(es); first: ", failures[0])));
  {
    const size_t step1 = resumed->outputs.size();
    std::vector<at::Tensor> continued(run.outputs.end() - static_cast<std::ptrdiff_t>(step1),
                                      run.outputs.end());
    Figures resume_figures;
    std::vector<std::string> differ;
    LOCKSTEP_RETURN_IF_ERROR(CompareLists(resumed->outputs, continued, "resumed outputs",
                                          numerics::Tolerance::Bitwise(), resume_figures, differ));
    LOCKSTEP_RETURN_IF_ERROR(CompareLists(resumed->parameters, run.parameters, "resumed parameters",
                                          numerics::Tolerance::Bitwise(), resume_figures, differ));
    checks.push_back(
        Check("resume", differ.empty(),
              differ.empty()
                  ? absl::StrCat(
                        "restarted from the state saved after step 0 (weights, Adam, "
                        "RNG streams: the caller's, the model stream, the named stream): step 1's ",
                        step1, " outputs and the final parameters bit-identical")
                  : absl::StrCat(differ.size(), " difference(s); first: ", differ[0])));
  }
  if (topology.cp_size() > 1) {
    // Judged on those microbatches alone: their outputs against the reference's.
    std::vector<at::Tensor> got, want;
    for (size_t i : run.empty_shard_outputs) {
      if (i >= expected.outputs.size()) continue;
      got.push_back(run.outputs[i]);
      want.push_back(expected.outputs[i]);
    }
    Figures empty_figures;
    std::vector<std::string> empty_failures;
    LOCKSTEP_RETURN_IF_ERROR(CompareLists(got, want, "a microbatch with an empty CP shard",
                                          tolerance, empty_figures, empty_failures));
    const bool ok = !got.empty() && empty_failures.empty();
    checks.push_back(Check(
        "empty_cp_shard", ok,
        got.empty() ? "no microbatch left a CP rank empty"
        : ok        ? absl::StrCat(got.size(),
                                   " microbatch(es) with fewer tokens than CP ranks ran and matched the "
                                          "reference")
             : absl::StrCat(empty_failures.size(), " mismatch(es); first: ", empty_failures[0])));
  }
  return checks;
}

absl::Status RunTrainerOracleVerdict(Communicator& world, int dp, int tp, int cp,
                                     NegativeControl control, c10::Device device, bool print) {
  LOCKSTEP_ASSIGN_OR_RETURN(Topology topology, Topology::CreateExact(world.size(), dp, tp, cp));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<OracleCheck> checks,
                            RunTrainerOracle(world, topology, control, device));
  std::vector<std::string> failed;
  for (const OracleCheck& c : checks) {
    if (print && world.rank() == 0) std::printf("%s: %s\n", c.name.c_str(), c.detail.c_str());
    if (!c.passed) failed.push_back(absl::StrCat(c.name, ": ", c.detail));
  }
  if (print) std::fflush(stdout);
  if (!failed.empty()) return absl::FailedPreconditionError(absl::StrJoin(failed, " | "));
  return absl::OkStatus();
}

}  // namespace qualification
}  // namespace lockstep
