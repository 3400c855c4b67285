// qualify: the main job. Runs a DP x TP x CP topology as local processes over Gloo (through the
// launcher) and checks lockstep's RNG contract on every rank, printing a table and writing JSON
// evidence. Exits 0 when every check passes on every rank, 1 otherwise.
//
//   qualify --dp 2 --tp 1 --cp 2 [--out evidence.json]
//           [--negative-control no-sync|aliasing-snapshot]
//
// Checks (each on every rank):
//   replica_agreement       after Synchronize on the TP x CP group, every replica of a DP
//                           worker draws the same uniforms, dropout mask and token mask as
//                           its group leader (whose global rank need not be 0)
//   dp_workers_independent  differently seeded DP workers keep different draws
//   model_stream            the caller's state is untouched by model-stream scopes, the model
//                           stream advances between scopes, and model masks agree across
//                           replicas
//   exception_restoration   an exception inside a scope still restores the caller exactly
//   partition_invariance    TP column x CP zigzag shards of a Philox dropout mask, gathered
//                           over the TP x CP group, reassemble to the unsharded mask
//   checkpoint_recompute    a checkpointed MLP block with dropout: the recompute's mask equals
//                           the forward's, input and parameter gradients are bit-identical to
//                           the plain block's, the caller's draws and live generator are
//                           untouched, nothing is retained after backward, and the replicas'
//                           gradients agree
// Negative controls (qualify must then fail): no-sync skips Synchronize; aliasing-snapshot
// makes the checkpoint save handles to the live generator instead of values.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "checkpoint/checkpoint.h"
#include "collectives/gloo_communicator.h"
#include "collectives/rendezvous.h"
#include "collectives/topology.h"
#include "nlohmann/json.hpp"
#include "rng/generator_state.h"
#include "rng/model_stream.h"
#include "rng/philox.h"
#include "rng/synchronize.h"
#include "testing/aliasing_rng_saver.h"
#include "tools/launcher.h"

namespace lockstep {
namespace {

using collectives::Communicator;
using collectives::Topology;
using nlohmann::json;

struct Flags {
  int dp = 1, tp = 1, cp = 1;
  std::string out;
  std::string negative_control;  // "", "no-sync", "aliasing-snapshot"
  bool worker = false;
  std::string results_dir;
  int timeout_seconds = 120;
};

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (name == "--worker") {
      flags.worker = true;
      continue;
    }
    if (i + 1 >= argc) return absl::InvalidArgumentError(name + " needs a value");
    const std::string value = argv[++i];
    int* number = name == "--dp"                ? &flags.dp
                  : name == "--tp"              ? &flags.tp
                  : name == "--cp"              ? &flags.cp
                  : name == "--timeout_seconds" ? &flags.timeout_seconds
                                                : nullptr;
    if (number != nullptr) {
      if (!absl::SimpleAtoi(value, number) || *number < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, " ", value, " is not a positive integer"));
      }
    } else if (name == "--out") {
      flags.out = value;
    } else if (name == "--negative-control") {
      if (value != "no-sync" && value != "aliasing-snapshot") {
        return absl::InvalidArgumentError(absl::StrCat("unknown negative control '", value,
                                                       "'; known: no-sync, aliasing-snapshot"));
      }
      flags.negative_control = value;
    } else if (name == "--results_dir") {
      flags.results_dir = value;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag ", name,
                       "; usage: qualify --dp N --tp N --cp N [--out FILE] "
                       "[--negative-control no-sync|aliasing-snapshot]"));
    }
  }
  return flags;
}

// ---------------------------------------------------------------------------------------------
// Worker: one rank.

struct CheckResult {
  std::string name;
  bool passed = false;
  std::string detail;
};

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

// One step of an MLP block with dropout from the synchronized state, plainly and checkpointed;
// the block records the dropout mask of every call (forward, then recompute).
struct RecomputeStep {
  std::vector<at::Tensor> masks;
  at::Tensor x_grad, w1_grad, w2_grad, drawn_between;
  std::optional<rng::RngSnapshot> after;
};

absl::StatusOr<RecomputeStep> RunRecomputeStep(const rng::RngSnapshot& start, bool checkpointed,
                                               const checkpoint::CheckpointOptions& options) {
  at::manual_seed(4242);  // the same parameters on every rank
  at::Tensor w1 = (at::randn({32, 64}) * 0.2).requires_grad_();
  at::Tensor w2 = (at::randn({64, 16}) * 0.2).requires_grad_();
  LOCKSTEP_RETURN_IF_ERROR(start.Restore());
  at::Tensor x = at::randn({8, 32}).requires_grad_();
  RecomputeStep step;
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
    out = block({x})[0];
  }
  step.drawn_between = at::rand({8});
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("backward of the recompute check", [&] {
    (out * at::linspace(-1, 1, out.numel()).reshape(out.sizes())).sum().backward();
  }));
  step.x_grad = x.grad();
  step.w1_grad = w1.grad();
  step.w2_grad = w2.grad();
  step.after = *rng::RngSnapshot::Capture(rng::DefaultGenerators{});
  return step;
}

absl::StatusOr<CheckResult> CheckRecompute(const Flags& flags, Communicator& world,
                                           const Topology& topo, const rng::RngSnapshot& synced) {
  const rng::DefaultGenerators generators;
  checkpoint::CheckpointOptions options;
  if (flags.negative_control == "aliasing-snapshot") {
    options.rng_streams = std::make_shared<testing::AliasingRngSaver>(generators);
  } else {
    options.rng_streams = std::make_shared<checkpoint::StreamSnapshots>(generators);
  }
  LOCKSTEP_ASSIGN_OR_RETURN(RecomputeStep plain, RunRecomputeStep(synced, false, options));
  LOCKSTEP_ASSIGN_OR_RETURN(RecomputeStep ckpt, RunRecomputeStep(synced, true, options));
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
  if (checkpoint::LiveCheckpointState().nodes != 0) problems.push_back("state retained");
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::vector<at::Tensor> grads,
      world.AllGather(at::cat({ckpt.x_grad.flatten(), ckpt.w1_grad.flatten()})));
  const std::vector<int> bad = DisagreeWithLeader(topo, grads);
  if (!bad.empty()) problems.push_back(absl::StrCat(bad.size(), " replica(s) disagree"));
  LOCKSTEP_RETURN_IF_ERROR(synced.Restore());
  return CheckResult{"checkpoint_recompute", problems.empty(),
                     problems.empty() ? "mask replayed; gradients bit-identical to plain; live "
                                        "RNG untouched; 0 retained; replicas agree"
                                      : absl::StrJoin(problems, "; ")};
}

absl::StatusOr<std::vector<CheckResult>> RunChecks(const Flags& flags, Communicator& world,
                                                   const Topology& topo) {
  const int rank = world.rank();
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::Coordinates c, topo.CoordinatesOf(rank));
  LOCKSTEP_ASSIGN_OR_RETURN(auto tpcp, world.NewGroup(topo.TpCpGroup(rank)));
  const rng::DefaultGenerators generators;  // CPU ranks
  std::vector<CheckResult> results;

  // The caller's generators differ on every rank, as after independent data loading.
  at::manual_seed(1000 + rank);
  (void)at::rand({rank + 1});
  const bool sync = flags.negative_control != "no-sync";
  if (sync) LOCKSTEP_RETURN_IF_ERROR(rng::Synchronize(tpcp.get(), generators));
  const rng::RngSnapshot synced = *rng::RngSnapshot::Capture(generators);

  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> draws, world.AllGather(CallerDraws()));
  {
    const std::vector<int> bad = DisagreeWithLeader(topo, draws);
    results.push_back({"replica_agreement", bad.empty(),
                       bad.empty() ? absl::StrCat("replicas match leader ",
                                                  Topology::Leader(topo.TpCpGroup(rank)))
                                   : absl::StrCat(bad.size(),
                                                  " rank(s) differ from their leader, "
                                                  "first ",
                                                  bad[0])});
  }
  {
    int same = 0;
    for (int d = 1; d < topo.dp_size(); ++d) {
      same += at::equal(draws[d * topo.tp_size() * topo.cp_size()], draws[0]);
    }
    results.push_back({"dp_workers_independent", same == 0,
                       topo.dp_size() == 1
                           ? "one DP worker"
                           : absl::StrCat(same, " DP worker(s) equal to worker 0")});
  }

  // Model stream: caller untouched, stream advances, replicas agree.
  {
    LOCKSTEP_RETURN_IF_ERROR(synced.Restore());
    at::Tensor caller_expected = at::rand({8});
    LOCKSTEP_RETURN_IF_ERROR(synced.Restore());
    rng::ModelStream model(generators);
    at::Tensor first, second;
    {
      rng::ModelStreamScope scope(model);
      first = at::dropout(at::ones({128}), 0.3, true);
    }
    {
      rng::ModelStreamScope scope(model);
      second = at::dropout(at::ones({128}), 0.3, true);
    }
    const bool caller_ok = at::equal(at::rand({8}), caller_expected);
    const bool advanced = !at::equal(first, second);
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> masks, world.AllGather(first));
    const std::vector<int> bad = DisagreeWithLeader(topo, masks);
    results.push_back({"model_stream", caller_ok && advanced && bad.empty(),
                       absl::StrCat("caller ", caller_ok ? "untouched" : "DISTURBED", "; stream ",
                                    advanced ? "advances" : "REPLAYS", "; ",
                                    bad.empty() ? "replica masks agree"
                                                : absl::StrCat(bad.size(), " replica(s) differ"))});
  }

  // Exception restoration.
  {
    LOCKSTEP_RETURN_IF_ERROR(synced.Restore());
    rng::ModelStream model(generators);
    try {
      rng::ModelStreamScope scope(model);
      (void)at::rand({100});
      throw std::runtime_error("injected");
    } catch (const std::runtime_error&) {
    }
    const bool restored = *rng::RngSnapshot::Capture(generators) == synced;
    results.push_back(
        {"exception_restoration", restored,
         restored ? "caller state bit-exact after the throw" : "caller state changed"});
  }

  // Partition invariance: TP column split x CP zigzag on the sequence.
  {
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
    LOCKSTEP_ASSIGN_OR_RETURN(
        at::Tensor a, rng::PartitionedDropoutMask(key, shape, shard_box(c.cp, c.tp, 0), 0.2, cpu));
    LOCKSTEP_ASSIGN_OR_RETURN(
        at::Tensor b, rng::PartitionedDropoutMask(key, shape, shard_box(c.cp, c.tp, 1), 0.2, cpu));
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> shards,
                              tpcp->AllGather(at::cat({a, b}, 0).to(at::kByte)));
    at::Tensor assembled = at::zeros(shape, at::kByte);
    for (int m = 0; m < tpcp->size(); ++m) {
      LOCKSTEP_ASSIGN_OR_RETURN(collectives::Coordinates mc,
                                topo.CoordinatesOf(tpcp->global_ranks()[m]));
      for (int half = 0; half < 2; ++half) {
        const auto box = shard_box(mc.cp, mc.tp, half);
        assembled.slice(0, box[0].begin, box[0].end)
            .slice(1, box[1].begin, box[1].end)
            .copy_(shards[m].slice(0, half * chunk, (half + 1) * chunk));
      }
    }
    LOCKSTEP_ASSIGN_OR_RETURN(
        at::Tensor full,
        rng::PartitionedDropoutMask(key, shape, {{0, shape[0]}, {0, shape[1]}}, 0.2, cpu));
    const bool equal = at::equal(assembled, full.to(at::kByte));
    results.push_back(
        {"partition_invariance", equal,
         absl::StrCat(tpcp->size(), " shard(s) of a [", shape[0], ", ", shape[1], "] mask ",
                      equal ? "reassemble" : "DO NOT reassemble", " to the unsharded mask")});
  }
  LOCKSTEP_ASSIGN_OR_RETURN(CheckResult recompute, CheckRecompute(flags, world, topo, synced));
  results.push_back(std::move(recompute));
  LOCKSTEP_RETURN_IF_ERROR(world.Barrier());
  return results;
}

int WorkerMain(const Flags& flags) {
  at::set_num_threads(1);
  json report;
  absl::Status status = [&]() -> absl::Status {
    LOCKSTEP_ASSIGN_OR_RETURN(auto rendezvous, collectives::Rendezvous::FromEnvironment(
                                                   absl::Seconds(flags.timeout_seconds)));
    collectives::GlooCommunicator::Options options;
    options.timeout = absl::Seconds(flags.timeout_seconds);
    LOCKSTEP_ASSIGN_OR_RETURN(auto world,
                              collectives::GlooCommunicator::Create(rendezvous, options));
    LOCKSTEP_ASSIGN_OR_RETURN(Topology topo,
                              Topology::CreateExact(world->size(), flags.dp, flags.tp, flags.cp));
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<CheckResult> results, RunChecks(flags, *world, topo));
    report["rank"] = world->rank();
    for (const CheckResult& r : results) {
      report["checks"].push_back({{"name", r.name}, {"passed", r.passed}, {"detail", r.detail}});
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) report["error"] = status.ToString();
  const char* rank = std::getenv("RANK");
  std::ofstream(absl::StrCat(flags.results_dir, "/rank", rank ? rank : "0", ".json"))
      << report.dump(2);
  if (!status.ok()) {
    std::cerr << "qualify worker: " << status << std::endl;
    return 1;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Parent: launch, collect, report.

int ParentMain(const Flags& flags, const char* self) {
  const int world = flags.dp * flags.tp * flags.cp;
  char dir[] = "/tmp/qualify.XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    std::perror("qualify: mkdtemp");
    return 2;
  }
  const std::string log_path = absl::StrCat(dir, "/workers.log");
  FILE* log = std::fopen(log_path.c_str(), "w");
  if (log == nullptr) {
    std::perror(("qualify: " + log_path).c_str());
    return 2;
  }
  tools::LaunchOptions launch;
  launch.nproc = world;
  launch.output_fd = fileno(log);
  launch.command = {self,
                    "--worker",
                    "--dp",
                    std::to_string(flags.dp),
                    "--tp",
                    std::to_string(flags.tp),
                    "--cp",
                    std::to_string(flags.cp),
                    "--results_dir",
                    dir,
                    "--timeout_seconds",
                    std::to_string(flags.timeout_seconds)};
  if (!flags.negative_control.empty()) {
    launch.command.push_back("--negative-control");
    launch.command.push_back(flags.negative_control);
  }
  absl::StatusOr<tools::LaunchResult> launched = tools::Launch(launch);
  std::fclose(log);
  if (!launched.ok()) {
    std::cerr << "qualify: " << launched.status() << std::endl;
    return 2;
  }

  // check name -> per-rank (passed, detail)
  std::vector<std::string> order;
  std::map<std::string, std::vector<json>> per_check;
  std::vector<std::string> errors;
  for (int r = 0; r < world; ++r) {
    std::ifstream in(absl::StrCat(dir, "/rank", r, ".json"));
    // A rank stopped mid-write leaves an empty or truncated file: report it, do not throw.
    const json report = in ? json::parse(in, nullptr, /*allow_exceptions=*/false) : json();
    if (!in || report.is_discarded() || !report.is_object()) {
      errors.push_back(absl::StrCat("rank ", r, " wrote no report"));
      continue;
    }
    if (report.contains("error")) {
      errors.push_back(absl::StrCat("rank ", r, ": ", report["error"].get<std::string>()));
    }
    for (const json& check : report.value("checks", json::array())) {
      const std::string name = check["name"];
      if (!per_check.count(name)) order.push_back(name);
      json entry = check;
      entry["rank"] = r;
      per_check[name].push_back(entry);
    }
  }

  const std::string topology = absl::StrCat("DP", flags.dp, " x TP", flags.tp, " x CP", flags.cp);
  std::cout << "qualify: " << topology << " (" << world << " local processes over Gloo)"
            << (flags.negative_control.empty() ? ""
                                               : "  negative control: " + flags.negative_control)
            << "\n\n";
  std::cout << absl::StrFormat("%-24s %-6s %-7s %s\n", "check", "result", "ranks",
                               "detail (rank 0)");
  bool all_passed = errors.empty() && launched->exit_code == 0 && !order.empty();
  json evidence;
  evidence["topology"] = {{"dp", flags.dp}, {"tp", flags.tp}, {"cp", flags.cp}, {"world", world}};
  evidence["negative_control"] = flags.negative_control;
  for (const std::string& name : order) {
    int passed = 0;
    for (const json& e : per_check[name]) passed += e["passed"].get<bool>();
    const bool ok = passed == world;
    all_passed = all_passed && ok;
    std::cout << absl::StrFormat("%-24s %-6s %d/%-5d %s\n", name, ok ? "PASS" : "FAIL", passed,
                                 world, per_check[name][0]["detail"].get<std::string>());
    evidence["checks"].push_back({{"name", name}, {"passed", ok}, {"ranks", per_check[name]}});
  }
  for (const std::string& e : errors) std::cout << "error: " << e << "\n";
  if (launched->exit_code != 0) {
    std::cout << "launch: " << launched->summary << " (worker output in " << log_path << ")\n";
  }
  evidence["errors"] = errors;
  evidence["passed"] = all_passed;
  std::cout << "\n" << (all_passed ? "PASS" : "FAIL") << ": " << topology << "\n";
  if (!flags.out.empty()) {
    std::ofstream out(flags.out);
    out << evidence.dump(2) << "\n";
    if (!out) {
      std::cerr << "qualify: cannot write " << flags.out << std::endl;
      return 2;
    }
    std::cout << "evidence: " << flags.out << "\n";
  }
  if (all_passed) {
    // Keep the per-rank reports and worker log only when something needs looking into.
    for (int r = 0; r < world; ++r) std::remove(absl::StrCat(dir, "/rank", r, ".json").c_str());
    std::remove(log_path.c_str());
    rmdir(dir);
  } else {
    std::cout << "per-rank reports and worker output: " << dir << "\n";
  }
  return all_passed ? 0 : 1;
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  absl::StatusOr<lockstep::Flags> flags = lockstep::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::cerr << "qualify: " << flags.status().message() << std::endl;
    return 2;
  }
  if (flags->worker) return lockstep::WorkerMain(*flags);
  return lockstep::ParentMain(*flags, "/proc/self/exe");
}
