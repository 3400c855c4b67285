// examples/lm/train: a small byte-level transformer language model trained through lockstep under
// DP x TP x CP, from the torchrun environment (start it with tools/launch, or torchrun).
//
//   launch --nproc=4 -- train --tp=1 --cp=2 --steps=300 --log_csv=loss.csv
//
// The order in which a program meets lockstep's pieces, each marked below with "(n)":
//   (1) the world from the torchrun environment and the DP x TP x CP groups;
//   (2) the rank's RNG streams (RankStreams), seeded like any PyTorch program;
//   (3) the model, split over TP and CP (model.h), and the optimizer;
//   (4) TrainerRank, the forward adapter, and optionally a restart from saved state;
//   (5) per step: the DP-local batch, drawn from the data, never from the model stream;
//   (6) the microbatch stream: each hand-back gives this replica the full outputs, and the
//       caller's RNG agreeing across the TP x CP group;
//   (7) the loss, from the planner's loss weights and a random token mask the caller draws;
//   (8) backward, the gradient all-reduce over CP and DP, the optimizer step;
//   (9) progress lines, the loss log, SaveState every N steps.

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "base/tool_flags.h"
#include "base/torch_boundary.h"
#include "collectives/communicator.h"
#include "collectives/gloo_communicator.h"
#include "collectives/rank_groups.h"
#include "collectives/rendezvous.h"
#include "collectives/topology.h"
#include "examples/lm/corpus.h"
#include "examples/lm/model.h"
#include "invariant/exact_gradients.h"
#include "invariant/mode.h"
#include "invariant/ops.h"
#include "numerics/deterministic_mode.h"
#include "numerics/op_recorder.h"
#include "numerics/safetensors.h"
#include "replay/state_capture.h"
#include "rng/philox.h"
#include "rng/rank_streams.h"
#include "rng/resume_state.h"
#include "torch/optim/adamw.h"
#include "trainer/trainer_rank.h"
#if LOCKSTEP_BUILT_WITH_CUDA
#include "c10/cuda/CUDACachingAllocator.h"
#include "collectives/nccl_communicator.h"
#endif

ABSL_FLAG(int, tp, 1, "tensor-parallel size (the DP size is the world size / (TP x CP))");
ABSL_FLAG(int, cp, 1, "context-parallel size");
ABSL_FLAG(int, steps, 300, "training steps (optimizer updates)");
ABSL_FLAG(int, sequences_per_step, 8, "sequences in the global batch of a step");
ABSL_FLAG(int, max_tokens, 64, "the longest sequence and the token budget of a microbatch");
ABSL_FLAG(int, width, 32, "the model's width (a multiple of --heads)");
ABSL_FLAG(int, heads, 2, "attention heads");
ABSL_FLAG(int, hidden, 64, "MLP hidden units (a multiple of --tp)");
ABSL_FLAG(int, blocks, 2, "transformer blocks");
ABSL_FLAG(double, lr, 3e-3, "AdamW's learning rate");
ABSL_FLAG(int, seed, 1, "every rank's seed (weights, dropout, the caller's RNG)");
ABSL_FLAG(std::string, device, "cpu", "cpu, or cuda (the GPU local_rank modulo the GPUs)");
ABSL_FLAG(std::string, corpus, "/usr/share/common-licenses/GPL-3",
          "the text to learn (shipped with every Debian system by base-files)");
ABSL_FLAG(bool, checkpoint_blocks, true, "recompute the blocks' activations in backward");
ABSL_FLAG(int, log_every, 20, "steps between progress lines");
ABSL_FLAG(lockstep::OutputPath, log_csv, lockstep::OutputPath(),
          "rank 0 writes step,loss,tokens_per_s here");
ABSL_FLAG(lockstep::OutputPath, losses, lockstep::OutputPath(),
          "rank 0 writes every step's loss here as a safetensors file (tensor 'loss')");
ABSL_FLAG(int, save_every, 0, "steps between saved states (0: none)");
ABSL_FLAG(std::string, save_dir, "", "where saved states go: <save_dir>/step<k>/rank<r>");
ABSL_FLAG(std::string, resume, "", "a saved state to continue from: <save_dir>/step<k>");
ABSL_FLAG(std::string, final_state, "", "save the final state here: <final_state>/rank<r>");
ABSL_FLAG(std::string, capture_dir, "",
          "capture every rank's complete state after each step's update here, for the "
          "state-replay protocol (replay/state_capture.h, tools/replay): "
          "<capture_dir>/step<k>/rank<r>");
ABSL_FLAG(std::string, resume_omit, "",
          "negative control of the state-replay protocol: resume (--resume) without restoring "
          "one part of the saved state: rng (every stream stays as this process seeded it), "
          "optimizer (a fresh AdamW) or data (the data cursor starts from the first batch)");
ABSL_FLAG(bool, mask_before_hand_back, false,
          "negative control: draw the token mask's seed before the step's first hand-back, where "
          "the replicas' caller states differ (the leader drew a sample), instead of after it");
ABSL_FLAG(std::string, record_operators, "",
          "record every ATen operator call of step --record_step (forward, backward, optimizer) "
          "here, for tools/diverge (numerics/op_recorder.h): <record_operators>/rank<r>.jsonl");
ABSL_FLAG(int, record_step, 0, "the step --record_operators records");
ABSL_FLAG(int, timeout_seconds, 120, "every collective's timeout");
ABSL_FLAG(bool, placement_invariant, false,
          "placement-invariant mode (invariant/mode.h): every layer and the loss through the "
          "mode's kernels and every gradient and the loss summed exactly, so that any DP x CP "
          "layout and any --microbatch_tokens give the same bits");
ABSL_FLAG(int, microbatch_tokens, 0,
          "the token budget of a microbatch (0: --max_tokens); a larger one packs several "
          "sequences into one microbatch");
ABSL_FLAG(bool, deterministic, false,
          "enforce lockstep's deterministic mode first (numerics/deterministic_mode.h): "
          "deterministic algorithms, cuDNN, cuBLAS workspace, NCCL algorithm and protocol");

namespace lockstep {
namespace examples {
namespace {

using collectives::Communicator;

// The fraction of tokens the caller's random mask keeps in the loss (half: a mask that differs
// between replicas then changes the training visibly, as the negative control shows).
constexpr double kMaskKeep = 0.5;

// (1) The world from the torchrun environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
// LOCAL_RANK): NCCL when there is a GPU per rank, Gloo otherwise; then the rank's groups
// (collectives/rank_groups.h: made in the same order on every rank).
absl::StatusOr<collectives::RankGroups> Connect(int tp, int cp, bool cuda, absl::Duration timeout) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto rendezvous, collectives::Rendezvous::FromEnvironment(timeout));
  std::unique_ptr<Communicator> world;
#if LOCKSTEP_BUILT_WITH_CUDA
  if (cuda && static_cast<int64_t>(at::getNumGPUs()) >= rendezvous->world_size()) {
    collectives::NcclCommunicator::Options options;
    options.timeout = timeout;
    LOCKSTEP_ASSIGN_OR_RETURN(world, collectives::NcclCommunicator::Create(rendezvous, options));
  }
#endif
  if (world == nullptr) {
    collectives::GlooCommunicator::Options options;
    options.timeout = timeout;
    LOCKSTEP_ASSIGN_OR_RETURN(world, collectives::GlooCommunicator::Create(rendezvous, options));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::Topology topology,
                            collectives::Topology::Create(world->size(), tp, cp));
  return collectives::RankGroups::Create(std::move(world), topology);
}

// The DP-local batch of one step, as TrainerRank takes it, with what the loss needs per row: the
// next token (the target), whether there is one, and each row's sequence id and position (the
// token mask is a function of them, so that every layout masks the same tokens).
struct StepBatch {
  trainer::TrainerInputs inputs;
  at::Tensor targets, has_target, ids, positions;  // int64 / bool [rows], on the CPU
};

absl::StatusOr<StepBatch> MakeBatch(const std::vector<Sequence>& sequences, c10::Device device) {
  StepBatch batch;
  std::vector<int64_t> tokens, targets, ids, positions;
  std::vector<uint8_t> has_target;
  std::vector<planner::Sequence> planned;
  for (const Sequence& s : sequences) {
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    planned.push_back(planner::Sequence::Of(n, s.id));
    for (int64_t t = 0; t < n; ++t) {
      tokens.push_back(s.tokens[t]);
      targets.push_back(t + 1 < n ? s.tokens[t + 1] : 0);
      has_target.push_back(t + 1 < n);
      ids.push_back(s.id);
      positions.push_back(t);
    }
  }
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("making the batch", [&] {
    batch.inputs =
        trainer::TrainerInputs::Of(std::move(planned), at::tensor(tokens, at::kLong).to(device));
    batch.targets = at::tensor(targets, at::kLong);
    batch.has_target = at::tensor(has_target, at::kByte).to(at::kBool);
    batch.ids = at::tensor(ids, at::kLong);
    batch.positions = at::tensor(positions, at::kLong);
  }));
  return batch;
}

// (7) The caller's random token mask: keep-decisions keyed by `seed` (which the caller draws
// from its own RNG after a hand-back) and each token's (sequence id, position), so every replica
// and every layout masks the same tokens — as long as every replica drew the same seed.
absl::StatusOr<at::Tensor> TokenMask(uint64_t seed, int64_t step, const at::Tensor& ids,
                                     const at::Tensor& positions, int64_t max_positions,
                                     c10::Device device) {
  const int64_t n = ids.size(0);
  const auto id = ids.accessor<int64_t, 1>();
  const auto position = positions.accessor<int64_t, 1>();
  const rng::PhiloxKey key = rng::PhiloxKey::Of(seed, /*stream=*/99, static_cast<uint64_t>(step));
  const std::vector<int64_t> space = {(int64_t{1} << 24) * max_positions};
  std::vector<at::Tensor> parts;
  for (int64_t t = 0; t < n;) {
    int64_t run = t + 1;
    while (run < n && id[run] == id[t] && position[run] == position[run - 1] + 1) ++run;
    const int64_t first = id[t] * max_positions + position[t];
    LOCKSTEP_ASSIGN_OR_RETURN(
        at::Tensor u, rng::PartitionedUniform(key, space, {{first, first + run - t}}, device));
    parts.push_back(std::move(u));
    t = run;
  }
  return CallTorch("the token mask", [&]() -> absl::StatusOr<at::Tensor> {
    return n == 0 ? at::zeros({0}, at::TensorOptions().device(device)) : at::cat(parts) < kMaskKeep;
  });
}

// (8) Every parameter's gradient summed over `group` (one all-reduce of them all, flattened).
absl::Status AllReduceGradients(const std::vector<at::Tensor>& parameters, Communicator* group) {
  if (group == nullptr) return absl::OkStatus();
  at::Tensor flat;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("flattening the gradients", [&] {
    std::vector<at::Tensor> grads;
    for (const at::Tensor& p : parameters) {
      grads.push_back(p.grad().defined() ? p.grad().flatten()
                                         : at::zeros({p.numel()}, p.options()));
    }
    flat = at::cat(grads);
  }));
  LOCKSTEP_RETURN_IF_ERROR(group->AllReduceSum(flat));
  return CallTorch("unflattening the gradients", [&] {
    int64_t at = 0;
    for (const at::Tensor& p : parameters) {
      at::Tensor summed = flat.narrow(0, at, p.numel()).view(p.sizes());
      if (p.grad().defined()) {
        p.mutable_grad().copy_(summed);
      } else {
        p.mutable_grad() = summed.clone();
      }
      at += p.numel();
    }
  });
}

// The first step of a run resumed from "<dir>/step<k>": k.
absl::StatusOr<int> StepOf(const std::string& dir) {
  const size_t slash = dir.find_last_of('/');
  const std::string base = slash == std::string::npos ? dir : dir.substr(slash + 1);
  int step = 0;
  if (base.rfind("step", 0) != 0 || !absl::SimpleAtoi(base.substr(4), &step) || step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--resume '", dir, "' is not a saved state's <save_dir>/step<k>"));
  }
  return step;
}

absl::Status SaveAll(trainer::TrainerRank& trainer, const std::string& dir, int rank,
                     const numerics::NamedTensors& named, const torch::optim::Optimizer& adam) {
  std::error_code ignored;  // every rank makes it; one that exists already is fine
  std::filesystem::create_directories(dir, ignored);
  trainer::SaveOptions options;
  options.include_rng_streams = true;  // every stream: the restart continues bit for bit
  return trainer.SaveState(absl::StrCat(dir, "/rank", rank), named, &adam, options);
}

// The whole program, one numbered step after another as the file's top comment lists them:
// long on purpose, so that a newcomer reads it from top to bottom without jumping between
// helpers (the helpers above are the parts that are not lockstep's).
absl::Status Train() {
  const bool cuda = absl::GetFlag(FLAGS_device) == "cuda";
  if (!cuda && absl::GetFlag(FLAGS_device) != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device '", absl::GetFlag(FLAGS_device), "' is neither cpu nor cuda"));
  }
  // Before any CUDA work: cuBLAS reads its workspace setting when its first handle is made.
  if (absl::GetFlag(FLAGS_deterministic)) {
    LOCKSTEP_RETURN_IF_ERROR(numerics::EnforceDeterministicMode().status());
  }
  // Placement-invariant mode for the whole run: read by the model's forward, recorded in the
  // execution context.
  std::optional<invariant::PlacementInvariantScope> placement_invariant;
  if (absl::GetFlag(FLAGS_placement_invariant)) placement_invariant.emplace();
  const int max_tokens = absl::GetFlag(FLAGS_max_tokens);
  const int microbatch_tokens = absl::GetFlag(FLAGS_microbatch_tokens) > 0
                                    ? absl::GetFlag(FLAGS_microbatch_tokens)
                                    : max_tokens;
  if (microbatch_tokens < max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("--microbatch_tokens=", microbatch_tokens,
                                                   " is below --max_tokens=", max_tokens,
                                                   ": the longest sequence must fit"));
  }
  const int per_step = absl::GetFlag(FLAGS_sequences_per_step);
  LOCKSTEP_ASSIGN_OR_RETURN(Corpus corpus, Corpus::Load(absl::GetFlag(FLAGS_corpus), max_tokens));
  // (1)
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::RankGroups groups,
                            Connect(absl::GetFlag(FLAGS_tp), absl::GetFlag(FLAGS_cp), cuda,
                                    absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds))));
  const int rank = groups.rank();
  const collectives::Coordinates me = groups.coordinates();
  const int dp_size = groups.topology().dp_size();
  c10::Device device(c10::kCPU);
  if (cuda) {
    if (!at::hasCUDA()) return absl::FailedPreconditionError("--device cuda: no CUDA device");
    const char* local = std::getenv("LOCAL_RANK");
    device =
        c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(
                                    (local != nullptr ? std::atoi(local) : 0) % at::getNumGPUs()));
  }
  // (2) The rank's streams. Every rank is seeded alike, as a PyTorch program is.
  LOCKSTEP_RETURN_IF_ERROR(
      CallTorch("seeding", [&] { at::manual_seed(absl::GetFlag(FLAGS_seed)); }));
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::shared_ptr<rng::RankStreams> streams,
      rng::RankStreams::Create(cuda ? rng::DefaultGenerators::WithCudaDevice(device.index())
                                    : rng::DefaultGenerators::CpuOnly()));
  // (3) The model and its optimizer.
  TinyLmConfig config;
  config.max_positions = max_tokens;
  config.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  config.width = absl::GetFlag(FLAGS_width);
  config.heads = absl::GetFlag(FLAGS_heads);
  config.hidden = absl::GetFlag(FLAGS_hidden);
  config.blocks = absl::GetFlag(FLAGS_blocks);
  LOCKSTEP_ASSIGN_OR_RETURN(
      TinyLm model, TinyLm::Create(config, me.tp, groups.topology().tp_size(), groups.tp_or_null(),
                                   groups.cp_or_null(), device));
  numerics::NamedTensors named = model.parameters();
  std::vector<at::Tensor> parameters;
  for (const auto& entry : named) parameters.push_back(entry.second);
  // Under the mode: every weight's gradient, and the step's loss, summed exactly (Note [Exact
  // accumulation] in invariant/exact_gradients.h), the same bits in every layout.
  std::unique_ptr<invariant::ExactGradients> exact;
  std::optional<invariant::ExactSum> exact_loss;
  if (placement_invariant.has_value()) {
    exact = std::make_unique<invariant::ExactGradients>(named);
    model.UseExactGradients(exact.get());
    LOCKSTEP_ASSIGN_OR_RETURN(invariant::ExactSum loss_sum, invariant::ExactSum::Make());
    exact_loss.emplace(std::move(loss_sum));
  }
  std::unique_ptr<torch::optim::AdamW> adam;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("creating AdamW", [&] {
    adam = std::make_unique<torch::optim::AdamW>(
        parameters, torch::optim::AdamWOptions(absl::GetFlag(FLAGS_lr)).weight_decay(0.01));
  }));
  // (4) The trainer: microbatches of at most max_tokens, packed in input order; the loss weights
  // as plain sums (the caller divides by the global batch's token count, the same in every
  // layout); activation checkpointing of the blocks.
  trainer::TrainerConfig trainer_config = trainer::TrainerConfig::Of(microbatch_tokens);
  trainer_config.plan.packing = planner::PACKING_IN_ORDER;
  trainer_config.plan.loss_normalization = planner::LOSS_SUM;
  trainer_config.activation_checkpointing = absl::GetFlag(FLAGS_checkpoint_blocks);
  int64_t step = 0;  // what the forward adapter keys its dropout with
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::unique_ptr<trainer::TrainerRank> trainer,
      trainer::TrainerRank::Create(
          trainer_config,
          trainer::TrainerRank::Collaborators::Of(groups.topology(), rank, groups.tp_cp(), streams),
          [&](const trainer::ShardWork& work) { return model.Forward(work, step); }));
  int first_step = 0;
  int64_t data_position = 0;  // batches consumed: the data cursor a resume must restore
  const std::string omit = absl::GetFlag(FLAGS_resume_omit);
  if (!omit.empty() && omit != "rng" && omit != "optimizer" && omit != "data") {
    return absl::InvalidArgumentError(
        absl::StrCat("--resume_omit '", omit, "' is none of rng, optimizer, data"));
  }
  if (const std::string resume = absl::GetFlag(FLAGS_resume); !resume.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(first_step, StepOf(resume));
    data_position = omit == "data" ? 0 : first_step;
    // The broken resume that omits the RNG puts back the streams this process had before loading.
    std::optional<rng::RngResumeStateProto> fresh_streams;
    if (omit == "rng") {
      LOCKSTEP_ASSIGN_OR_RETURN(fresh_streams, rng::CaptureResumeState(*streams));
    }
    LOCKSTEP_ASSIGN_OR_RETURN(trainer::LoadReport loaded,
                              trainer->LoadState(absl::StrCat(resume, "/rank", rank), named,
                                                 omit == "optimizer" ? nullptr : adam.get()));
    if ((!loaded.optimizer && omit != "optimizer") || !loaded.rng_streams) {
      return absl::DataLossError(absl::StrCat(resume, ": the saved state is not complete"));
    }
    if (fresh_streams.has_value()) {
      LOCKSTEP_RETURN_IF_ERROR(rng::RestoreResumeState(*fresh_streams, *streams));
    }
  } else if (!omit.empty()) {
    return absl::InvalidArgumentError("--resume_omit needs --resume");
  }
  // The TP x CP group's leader logs a sample now and then: a draw from its RNG that its replicas
  // do not make. The next hand-back makes their states agree again.
  const bool leader = groups.tp_cp()->rank() == 0;
  const bool log = rank == 0;
  std::optional<std::ofstream> csv;
  if (log && !absl::GetFlag(FLAGS_log_csv).path.empty()) {
    csv.emplace(absl::GetFlag(FLAGS_log_csv).path);
    *csv << "step,loss,tokens_per_s\n";
  }
  std::vector<double> losses;
  auto since = std::chrono::steady_clock::now();
  int64_t tokens_since = 0;
  const std::string record_operators = absl::GetFlag(FLAGS_record_operators);
  const int record_step = absl::GetFlag(FLAGS_record_step);
  if (!record_operators.empty() &&
      (record_step < first_step || record_step >= absl::GetFlag(FLAGS_steps))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--record_step=", record_step, " is not one of the steps this run makes [",
                     first_step, ", ", absl::GetFlag(FLAGS_steps), ")"));
  }
  for (step = first_step; step < absl::GetFlag(FLAGS_steps); ++step) {
    // Every operator call of one step, when asked (the scope closes before the recorder does).
    std::unique_ptr<numerics::OperatorRecorder> recorder;
    std::optional<numerics::OperatorRecorder::Scope> recorded_step;
    if (!record_operators.empty() && step == record_step) {
      std::filesystem::create_directories(record_operators);
      numerics::OperatorRecorderOptions options;
      options.rank = rank;
      LOCKSTEP_ASSIGN_OR_RETURN(
          recorder, numerics::OperatorRecorder::Create(
                        absl::StrCat(record_operators, "/rank", rank, ".jsonl"), options));
      recorded_step.emplace(*recorder, absl::StrCat("step", step));
    }
    // (5) The DP-local batch and the global token count the loss is divided by.
    int64_t global_targets = 0;
    const int64_t batch_index = data_position++;
    for (const Sequence& s : corpus.GlobalBatch(batch_index, per_step)) {
      global_targets += static_cast<int64_t>(s.tokens.size()) - 1;
      tokens_since += static_cast<int64_t>(s.tokens.size());
    }
    LOCKSTEP_ASSIGN_OR_RETURN(
        StepBatch batch, MakeBatch(corpus.DpBatch(batch_index, per_step, me.dp, dp_size), device));
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("zeroing the gradients", [&] { adam->zero_grad(); }));
    // (6) The stream of this step's microbatches.
    std::optional<uint64_t> mask_seed;
    auto draw_mask_seed = [&]() -> absl::Status {
      return CallTorch("the mask's seed", [&] {
        mask_seed =
            static_cast<uint64_t>(at::randint(int64_t{1} << 62, {1}, at::kLong).item<int64_t>());
      });
    };
    if (absl::GetFlag(FLAGS_mask_before_hand_back)) LOCKSTEP_RETURN_IF_ERROR(draw_mask_seed());
    LOCKSTEP_ASSIGN_OR_RETURN(trainer::MicrobatchStream stream,
                              trainer->ForwardMicrobatches(batch.inputs));
    at::Tensor step_loss = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
    at::Tensor last_logits;
    while (true) {
      LOCKSTEP_ASSIGN_OR_RETURN(std::optional<trainer::MicrobatchOutput> out, stream.Next());
      if (!out.has_value()) break;
      // Right after a hand-back every replica's RNG agrees: draw the mask's seed now, never inside
      // the model (that would be the model stream) and never before the hand-back.
      if (!mask_seed.has_value()) LOCKSTEP_RETURN_IF_ERROR(draw_mask_seed());
      const at::Tensor rows = out->input_rows;
      LOCKSTEP_ASSIGN_OR_RETURN(
          at::Tensor keep, TokenMask(*mask_seed, step, batch.ids.index_select(0, rows),
                                     batch.positions.index_select(0, rows), max_tokens, device));
      at::Tensor targets, nll, terms;
      LOCKSTEP_RETURN_IF_ERROR(CallTorch(
          "the targets", [&] { targets = batch.targets.index_select(0, rows).to(device); }));
      if (placement_invariant.has_value()) {
        LOCKSTEP_ASSIGN_OR_RETURN(nll, invariant::CrossEntropy(out->outputs, targets));
      }
      LOCKSTEP_RETURN_IF_ERROR(CallTorch("the loss and backward", [&] {
        // (7) Next-token cross-entropy over every token of the microbatch (every replica has the
        // full outputs), weighted by the planner's loss weights, the caller's mask and whether
        // the token has a next one; divided by the global batch's expected count of kept tokens,
        // the same in every layout, so that the sum over DP workers is the global mean.
        const at::Tensor weight =
            out->loss_weights.to(device) * batch.has_target.index_select(0, rows).to(device) *
            keep.to(at::kDouble) / (kMaskKeep * static_cast<double>(global_targets));
        if (!nll.defined()) {
          nll = at::cross_entropy_loss(out->outputs, targets, {}, at::Reduction::None);
        }
        terms = nll.to(at::kDouble) * weight;
        const at::Tensor loss = terms.sum();
        // (8) Backward: each replica's gradient reaches its own rows of the outputs only.
        loss.backward();
        step_loss += loss.detach();
        last_logits = out->outputs.detach();
      }));
      // Under the mode the step's loss is the exact sum of every token's term.
      if (exact_loss.has_value()) {
        LOCKSTEP_RETURN_IF_ERROR(exact_loss->Add(terms.detach()));
      }
    }
    // The leader's sample (its own RNG draw, between hand-backs). Drawn on the host, where it is
    // printed, and so from the CPU generator, the one the mask's seed comes from on every device.
    if (leader && last_logits.defined() && last_logits.size(0) > 0) {
      LOCKSTEP_RETURN_IF_ERROR(CallTorch("the leader's sample", [&] {
        const at::Tensor next =
            at::multinomial(at::softmax(last_logits[-1].to(at::kCPU, at::kFloat), 0), 1);
        if (log && step % absl::GetFlag(FLAGS_log_every) == 0) {
          LOCKSTEP_VLOG(1) << "step " << step << ": the model's next byte would be "
                           << next.item<int64_t>();
        }
      }));
    }
    // (8) Gradients: over CP (each CP rank back-propagated its own tokens), then over DP. TP
    // ranks hold the same gradient for replicated parameters and their own shard's for split ones.
    // Under the mode, integer sums over CP and DP (exact in any grouping), written once.
    if (exact != nullptr) {
      LOCKSTEP_RETURN_IF_ERROR(exact->SumOver(groups.cp_or_null()));
      LOCKSTEP_RETURN_IF_ERROR(exact->SumOver(groups.dp_or_null()));
      LOCKSTEP_RETURN_IF_ERROR(exact->WriteGradients());
      LOCKSTEP_RETURN_IF_ERROR(exact_loss->SumOver(groups.dp_or_null()));
      LOCKSTEP_ASSIGN_OR_RETURN(const double total, exact_loss->Total());
      LOCKSTEP_RETURN_IF_ERROR(CallTorch(
          "the step's exact loss", [&] { step_loss = at::scalar_tensor(total, at::kDouble); }));
      exact_loss->Zero();
    } else {
      LOCKSTEP_RETURN_IF_ERROR(AllReduceGradients(parameters, groups.cp_or_null()));
      LOCKSTEP_RETURN_IF_ERROR(AllReduceGradients(parameters, groups.dp_or_null()));
      if (Communicator* dp = groups.dp_or_null())
        LOCKSTEP_RETURN_IF_ERROR(dp->AllReduceSum(step_loss));
    }
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("AdamW's step", [&] { adam->step(); }));
    if (recorder != nullptr) {
      recorded_step.reset();
      LOCKSTEP_RETURN_IF_ERROR(recorder->Close());
    }
    if (const std::string captures = absl::GetFlag(FLAGS_capture_dir); !captures.empty()) {
      replay::CaptureComponents state;
      state.weights = named;
      state.optimizer = adam.get();
      state.streams = streams.get();
      state.data_position = data_position;
      state.absent["ledger"] =
          "examples/lm keeps no recovery ledger (it does not use admission's out-of-memory "
          "recovery)";
      LOCKSTEP_RETURN_IF_ERROR(
          replay::WriteStateCapture(captures, step + 1, rank, groups.world().size(), state));
    }
    const double loss = step_loss.item<double>();
    losses.push_back(loss);
    // (9) Progress, the log, saved states.
    if (log && ((step + 1) % absl::GetFlag(FLAGS_log_every) == 0 ||
                step + 1 == absl::GetFlag(FLAGS_steps))) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
      const double rate = static_cast<double>(tokens_since) / seconds;
      std::string memory;
#if LOCKSTEP_BUILT_WITH_CUDA
      if (cuda) {
        const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
        memory = absl::StrFormat(", peak memory %.1f MiB",
                                 static_cast<double>(stats.allocated_bytes[0].peak) / (1 << 20));
      }
#endif
      std::printf("step %ld loss %.4f tokens/s %.0f%s\n", static_cast<long>(step + 1), loss, rate,
                  memory.c_str());
      std::fflush(stdout);
      since = std::chrono::steady_clock::now();
      tokens_since = 0;
    }
    if (csv.has_value()) *csv << step + 1 << "," << absl::StrFormat("%.17g", loss) << "\n";
    const int every = absl::GetFlag(FLAGS_save_every);
    if (every > 0 && (step + 1) % every == 0) {
      LOCKSTEP_RETURN_IF_ERROR(
          SaveAll(*trainer, absl::StrCat(absl::GetFlag(FLAGS_save_dir), "/step", step + 1), rank,
                  named, *adam));
    }
  }
  if (const std::string dir = absl::GetFlag(FLAGS_final_state); !dir.empty()) {
    LOCKSTEP_RETURN_IF_ERROR(SaveAll(*trainer, dir, rank, named, *adam));
  }
  if (log && !absl::GetFlag(FLAGS_losses).path.empty()) {
    LOCKSTEP_RETURN_IF_ERROR(numerics::WriteSafetensors(
        absl::GetFlag(FLAGS_losses).path, {{"loss", at::tensor(losses, at::kDouble)}}, {}));
  }
  return groups.world().Barrier();
}

}  // namespace
}  // namespace examples
}  // namespace lockstep

int main(int argc, char** argv) {
  const std::vector<std::string> args = lockstep::ParseToolFlags(
      argc, argv,
      "train [FLAGS]: trains a small byte-level language model through lockstep, under DP x TP x "
      "CP from the torchrun environment (start it with tools/launch or torchrun)");
  if (absl::Status s = lockstep::NoPositionalArguments(args); !s.ok()) {
    std::fprintf(stderr, "train: %s\n", std::string(s.message()).c_str());
    return lockstep::kBadInputExitCode;
  }
  at::set_num_threads(1);
  const absl::Status status = lockstep::examples::Train();
  if (!status.ok()) {
    std::fprintf(stderr, "train: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
