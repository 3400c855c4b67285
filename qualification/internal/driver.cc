#include "qualification/qualification.h"

#include "qualification/internal/checks.h"
#include "qualification/internal/reports.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
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
#include "admission/recovery.h"
#include "base/file_io.h"
#include "base/json.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "base/temp_dir.h"
#include "base/torch_boundary.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/rng_state_saver.h"
#include "collectives/gloo_communicator.h"
#include "qualification/toy_objective.h"
#if LOCKSTEP_BUILT_WITH_CUDA
#include "ATen/cuda/CUDAContext.h"
#include "collectives/nccl_communicator.h"
#endif
#include "collectives/rendezvous.h"
#include "invariant/mode.h"
#include "launch/launcher.h"
#include "nlohmann/json.hpp"
#include "numerics/deterministic_mode.h"
#include "numerics/execution_context.h"
#include "planner/planner.h"
#include "qualification/oracle.h"
#include "qualification/reference_model.h"
#include "rng/philox.h"
#include "rng/synchronize.h"

namespace lockstep {
namespace qualification {
namespace {

using collectives::Communicator;
using collectives::Topology;
using nlohmann::json;

}  // namespace

absl::StatusOr<std::vector<CheckResult>> RunRankChecks(Communicator& world,
                                                       const Topology& topology,
                                                       const QualifyOptions& options,
                                                       const std::string& ledger_dir) {
  LOCKSTEP_ASSIGN_OR_RETURN(RankSetup setup, SetUpRank(world, topology, options.control));
  setup.inject_oom = options.inject_oom;
  setup.ledger_dir = ledger_dir;
  setup.device = options.device;
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
  for (auto family : {&CheckTrainer, &CheckVariability}) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<CheckResult> checks, family(setup));
    for (CheckResult& result : checks) {
      LOCKSTEP_VLOG(1) << "rank " << world.rank() << ": " << result.name << " "
                       << (result.passed ? "PASS" : "FAIL") << " (" << result.detail << ")";
      results.push_back(std::move(result));
    }
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
  if (options.control == NegativeControl::kLibTorchAttention && !options.placement_invariant) {
    return absl::InvalidArgumentError(
        "--negative_control=libtorch-attention breaks placement-invariant mode: add "
        "--placement_invariant");
  }
  // Zero failures would leave oom_recovery nothing to recover: it would pass having proved
  // nothing.
  if (options.inject_oom < 1 || options.inject_oom > kMaxInjectedOom) {
    return absl::InvalidArgumentError(
        absl::StrCat("--inject_oom ", options.inject_oom, " is outside [1, ", kMaxInjectedOom,
                     "]: oom_recovery needs at least one injected failure to prove a recovery"));
  }
  if (options.nnodes < 1 || options.nnodes > launch::kMaxNodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--nnodes ", options.nnodes, " is not an integer in [1, ", launch::kMaxNodes, "]"));
  }
  if (options.node_rank < 0 || options.node_rank >= options.nnodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--node_rank ", options.node_rank, " is not an integer in [0, ", options.nnodes, ")"));
  }
  if (world % options.nnodes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nnodes ", options.nnodes, " does not divide the world of ", world,
                     " processes (--dp x --tp x --cp); every node runs the same number of ranks"));
  }
  if ((options.nnodes > 1 || options.master_port != 0) &&
      (options.master_port < 1 || options.master_port > 65534)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--master_port ", options.master_port, " with --nnodes ", options.nnodes,
        ": give every node the same port in [1, 65534] (the actors check also uses port + 1)"));
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
  // The workers of this node.
  const int64_t world = int64_t{options.dp} * options.tp * options.cp / std::max(options.nnodes, 1);
  const std::string flags =
      absl::StrCat("--dp ", options.dp, " x --tp ", options.tp, " x --cp ", options.cp,
                   options.nnodes > 1 ? absl::StrCat(" / --nnodes ", options.nnodes) : "", " = ",
                   world, " worker processes");
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

#if LOCKSTEP_BUILT_WITH_CUDA
// Note [Transport across nodes]: NCCL needs a GPU of its own for every rank. A node's count of
// GPUs cannot tell that (hosts made of namespaces, or containers, may see the same physical GPU),
// so every rank publishes the UUID of the GPU it would use (its local rank's; "none" without
// one) and the job takes NCCL only when all of them are present and distinct. Every rank
// decides from the same published values, so they all take the same transport.
absl::StatusOr<bool> EveryRankHasItsOwnGpu(collectives::Rendezvous& rendezvous,
                                           const QualifyOptions& options) {
  const char* per_node = std::getenv("LOCAL_WORLD_SIZE");
  const int64_t local_ranks = per_node != nullptr ? std::atoi(per_node) : rendezvous.world_size();
  std::string mine = "none";
  if (options.device == "cuda" && at::hasCUDA() &&
      static_cast<int64_t>(at::getNumGPUs()) >= local_ranks) {
    const cudaDeviceProp* props = nullptr;
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("reading the GPU's UUID", [&] {
      props = at::cuda::getDeviceProperties(rendezvous.local_rank());
    }));
    mine.clear();
    for (char byte : props->uuid.bytes) {
      absl::StrAppend(&mine, absl::Hex(static_cast<unsigned char>(byte), absl::kZeroPad2));
    }
  }
  auto key = [](int r) { return absl::StrCat("qualify/gpu/", r); };
  LOCKSTEP_RETURN_IF_ERROR(rendezvous.Set(key(rendezvous.rank()), mine));
  std::set<std::string> gpus;
  for (int r = 0; r < rendezvous.world_size(); ++r) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string gpu, rendezvous.Get(key(r)));
    if (gpu == "none" || !gpus.insert(gpu).second) return false;
  }
  return true;
}
#endif

int RunWorker(const QualifyOptions& options, const std::string& results_dir) {
  const absl::Duration timeout = options.timeout;
  // The variability checks run deterministic algorithms, before any cuBLAS call.
  if (options.device == "cuda") numerics::PrepareCublasForDeterminism();
  at::set_num_threads(1);
  std::optional<invariant::PlacementInvariantScope> placement_invariant;  // for the whole worker
  json report;
  std::shared_ptr<collectives::Rendezvous> rendezvous;
  const absl::Status status = [&]() -> absl::Status {
    // First, before any CUDA work (a contradicting setting fails the rank, naming it).
    report["deterministic_mode"] = options.deterministic;
    if (options.deterministic)
      LOCKSTEP_RETURN_IF_ERROR(numerics::EnforceDeterministicMode().status());
    report["placement_invariant_mode"] = options.placement_invariant;
    if (options.placement_invariant) placement_invariant.emplace();
    LOCKSTEP_ASSIGN_OR_RETURN(rendezvous, collectives::Rendezvous::FromEnvironment(timeout));
    std::unique_ptr<Communicator> world;
    std::string transport = "gloo";
#if LOCKSTEP_BUILT_WITH_CUDA
    // --device cuda with a GPU of its own for every rank: NCCL, one GPU per rank (its local
    // rank's; Note [Transport across nodes]).
    LOCKSTEP_ASSIGN_OR_RETURN(const bool own_gpus, EveryRankHasItsOwnGpu(*rendezvous, options));
    if (own_gpus) {
      collectives::NcclCommunicator::Options nccl;
      nccl.timeout = timeout;
      LOCKSTEP_ASSIGN_OR_RETURN(world, collectives::NcclCommunicator::Create(rendezvous, nccl));
      transport = "nccl";
    }
#endif
    if (world == nullptr) {
      collectives::GlooCommunicator::Options gloo;
      gloo.timeout = timeout;
      LOCKSTEP_ASSIGN_OR_RETURN(world, collectives::GlooCommunicator::Create(rendezvous, gloo));
    }
    report["transport"] = transport;
    LOCKSTEP_ASSIGN_OR_RETURN(
        Topology topo, Topology::CreateExact(world->size(), options.dp, options.tp, options.cp));
    report["rank"] = world->rank();
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    report["host"] = host;
    std::vector<CheckResult> results;
    if (options.actor_round) {
      LOCKSTEP_ASSIGN_OR_RETURN(collectives::RankGroups groups,
                                collectives::RankGroups::CreateBorrowing(*world, topo));
      RankSetup setup(std::move(groups));
      setup.control = options.control;
      setup.device = options.device;
      setup.ledger_dir = results_dir;
      LOCKSTEP_ASSIGN_OR_RETURN(CheckResult actors, CheckSecondActor(setup));
      results.push_back(std::move(actors));
    } else {
      LOCKSTEP_ASSIGN_OR_RETURN(results, RunRankChecks(*world, topo, options, results_dir));
    }
    for (const CheckResult& r : results) {
      json check = {{"name", r.name}, {"passed", r.passed}, {"detail", r.detail}};
      if (!r.evidence.is_null()) check["evidence"] = r.evidence;
      report["checks"].push_back(std::move(check));
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) report["error"] = status.ToString();
  const char* rank = std::getenv("RANK");
  const std::string prefix =
      absl::StrCat(results_dir, options.actor_round ? "/actors.rank" : "/rank");
  // Whole or absent (a rank killed while writing leaves no part of a report).
  const std::string report_path = absl::StrCat(prefix, rank != nullptr ? rank : "0", ".json");
  if (absl::Status s =
          WriteFileAtomically(report_path, DumpJson(report, 2), WriteOptions{/*durable=*/false});
      !s.ok()) {
    LOCKSTEP_LOG(ERROR) << "qualify worker: its report: " << s;
  }
  // Note [Reports across nodes].
  const char* per_node = std::getenv("LOCAL_WORLD_SIZE");
  if (rendezvous != nullptr && per_node != nullptr &&
      std::atoi(per_node) < rendezvous->world_size()) {
    internal::GatherReports(*rendezvous, report, prefix);
  }
  if (!status.ok()) {
    LOCKSTEP_LOG(ERROR) << "qualify worker: " << status;
    return 1;
  }
  return 0;
}

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

namespace {

// What the flags ask that this build, this machine or the reference model cannot run, found
// before any worker starts (bad input: exit 2), not after the rendezvous.
absl::Status CheckRunnable(const QualifyOptions& options) {
  constexpr int64_t kHidden = ReferenceModel::kHidden;
  if (kHidden % options.tp != 0) {
    std::vector<int> sizes;
    for (int tp = 1; tp <= kHidden; ++tp) {
      if (kHidden % tp == 0) sizes.push_back(tp);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("--tp ", options.tp, " does not divide the reference model's ", kHidden,
                     " hidden units, which the trainer's oracle splits over TP (use --tp ",
                     absl::StrJoin(sizes, ", "), ")"));
  }
  if (options.device == "cuda" && (!at::hasCUDA() || at::getNumGPUs() == 0)) {
    return absl::InvalidArgumentError(
        LOCKSTEP_BUILT_WITH_CUDA
            ? "--device cuda: no CUDA device is visible to this process"
            : "--device cuda: this qualify was built without CUDA (build with --config=cuda)");
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// Refuses, before the job runs and creating nothing under the evidence's name, outputs that
// could not be written after it.
absl::Status CheckOutputs(const QualifyOptions& options) {
  if (!options.evidence_path.empty()) {
    if (absl::Status s = CheckWritable(options.evidence_path); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot write the evidence file '",
                                                     options.evidence_path, "': ", s.message()));
    }
  }
  if (!options.report_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(options.report_dir, error);
    if (error || access(options.report_dir.c_str(), W_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("cannot write the report directory '",
                                                     options.report_dir, "'",
                                                     error ? ": " + error.message() : ""));
    }
  }
  return absl::OkStatus();
}

// This node's launch of the workers, their output into `output_fd`.
launch::LaunchOptions WorkerLaunch(const QualifyOptions& options, const std::string& dir,
                                   int output_fd) {
  launch::LaunchOptions launch;
  launch.nproc = options.dp * options.tp * options.cp / options.nnodes;  // this node's ranks
  launch.nnodes = options.nnodes;
  launch.node_rank = options.node_rank;
  launch.master_addr = options.master_addr;
  launch.master_port = options.master_port;
  launch.output_fd = output_fd;
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
  if (options.deterministic) launch.command.push_back("--deterministic");
  if (options.placement_invariant) launch.command.push_back("--placement_invariant");
  return launch;
}

// qualify's first line: the topology, where its processes run, the transport and the control.
void PrintJob(const QualifyOptions& options, int nproc, std::ostream& out) {
  const int world = options.dp * options.tp * options.cp;
  const std::string where =
      options.nnodes == 1
          ? absl::StrCat(world, " local processes")
          : absl::StrCat(world, " processes on ", options.nnodes, " nodes; this is node ",
                         options.node_rank, ", ranks ", options.node_rank * nproc, "..",
                         (options.node_rank + 1) * nproc - 1);
  out << "qualify: DP" << options.dp << " x TP" << options.tp << " x CP" << options.cp << " ("
      << where
      << (options.device == "cuda"
              ? "; the trainer oracle on CUDA, over NCCL when there is a GPU per rank, else Gloo"
              : " over Gloo")
      << ")"
      << (options.control == NegativeControl::kNone
              ? ""
              : "  negative control: " + NegativeControlName(options.control))
      << std::endl;
}

// A node other than 0 ran its ranks (and its actors' round): it says how they ended and the
// errors its ranks reported, and leaves the table and the verdict to node 0 (Note [Reports
// across nodes]). Whether its ranks ran.
bool FinishOtherNode(const QualifyOptions& options, const launch::LaunchOptions& launch,
                     const launch::LaunchResult& launched, TempDir& dir, std::ostream& out) {
  std::string second_failure;
  if (launched.exit_code == 0) second_failure = internal::LaunchSecondActor(launch, dir.path());
  const bool ran = launched.exit_code == 0 && second_failure.empty();
  out << "node " << options.node_rank << ": " << launched.summary
      << (second_failure.empty() ? "" : "; " + second_failure)
      << "; the table, the verdict and the evidence are node 0's\n";
  for (const std::string& line :
       internal::NodeErrors(dir.path(), options.node_rank * launch.nproc, launch.nproc)) {
    out << "error: " << line << "\n";
  }
  if (!ran) out << "worker output: " << dir.Release() << "\n";
  return ran;
}

}  // namespace

absl::StatusOr<bool> RunQualify(const QualifyOptions& options, std::ostream& out) {
  LOCKSTEP_RETURN_IF_ERROR(ValidateQualifyOptions(options));
  LOCKSTEP_RETURN_IF_ERROR(ValidateQualifyMachine(
      options, static_cast<int>(std::thread::hardware_concurrency()), AvailableMemory()));
  const int world = options.dp * options.tp * options.cp;
  LOCKSTEP_RETURN_IF_ERROR(CheckRunnable(options));
  LOCKSTEP_RETURN_IF_ERROR(CheckOutputs(options));
  // The job's working directory (the workers' reports and output): removed at the end unless
  // something in it needs looking into (Release).
  LOCKSTEP_ASSIGN_OR_RETURN(TempDir dir, TempDir::Make("qualify"));
  const std::string log_path = absl::StrCat(dir.path(), "/workers.log");
  FILE* log = std::fopen(log_path.c_str(), "w");
  if (log == nullptr)
    return absl::InternalError(absl::StrCat(log_path, ": ", std::strerror(errno)));
  const launch::LaunchOptions launch = WorkerLaunch(options, dir.path(), fileno(log));
  PrintJob(options, launch.nproc, out);
  // Named before anything runs, so that a qualify killed outright has said where its workers'
  // output is; removed at the end when there is nothing in it to look into.
  out << "working directory: " << dir.path() << " (removed at the end unless something fails)"
      << std::endl;
  LOCKSTEP_VLOG(1) << "qualify: launching " << world << " workers; their output goes to "
                   << log_path;
  absl::StatusOr<launch::LaunchResult> launched = launch::Launch(launch);
  std::fclose(log);
  if (!launched.ok()) return launched.status();
  LOCKSTEP_VLOG(1) << "qualify: workers done: " << launched->summary;
  if (options.node_rank != 0) return FinishOtherNode(options, launch, *launched, dir, out);

  std::vector<std::string> missing;
  const std::vector<json> reports = internal::ReadReports(dir.path() + "/rank", world, missing);
  internal::CollectedChecks checks = internal::CollectChecks(reports, std::move(missing));
  // The actors check: a second round of processes, once the first saved the state they load
  // (on every node; node 0 reads every rank's result).
  if (checks.errors.empty() && launched->exit_code == 0 &&
      checks.per_check.count("repeatability")) {
    const std::string failure = internal::LaunchSecondActor(launch, dir.path());
    checks.per_check["actors"] = internal::ActorsEntries(dir.path(), world, failure);
    checks.order.insert(std::find(checks.order.begin(), checks.order.end(), "repeatability") + 1,
                        "actors");
  }
  const json evidence = internal::TableAndEvidence(options, checks, *launched, log_path, out);
  const bool all_passed = evidence["passed"].get<bool>();
  if (!options.evidence_path.empty()) {
    // The previous evidence stays whole until the new one is complete (file_io.h).
    if (absl::Status s = WriteFileAtomically(options.evidence_path, DumpJson(evidence, 2) + "\n");
        !s.ok()) {
      return absl::InternalError(absl::StrCat("cannot write the evidence file: ", s.message(),
                                              " (per-rank reports and worker output kept in ",
                                              dir.Release(), ")"));
    }
    out << "evidence: " << options.evidence_path << "\n";
  }
  if (!options.report_dir.empty()) {
    absl::StatusOr<std::string> warning = WriteReport(evidence, options.report_dir);
    if (!warning.ok()) {
      return absl::InternalError(absl::StrCat("the report: ", warning.status().message(),
                                              " (per-rank reports and worker output kept in ",
                                              dir.Release(), ")"));
    }
    // The page is a view of the evidence: one that could not be drawn does not change the verdict.
    if (!warning->empty()) out << "warning: the report page: " << *warning << "\n";
    out << "report: " << options.report_dir << "/index.html\n";
  }
  // Keep the per-rank reports and worker log only when something needs looking into.
  if (!all_passed) out << "per-rank reports and worker output: " << dir.Release() << "\n";
  return all_passed;
}

}  // namespace qualification
}  // namespace lockstep
