#include "qualification/qualification.h"

#include "qualification/internal/checks.h"

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
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

// Note [Reports across nodes]: a worker's report is a file in its node's job directory. When the
// world spans nodes, every rank also puts its report in the rendezvous store and rank 0 (node 0)
// writes them all into its directory, so node 0's qualify sees every rank. A rank whose report
// never comes is named by the driver ("wrote no report").
void GatherReports(collectives::Rendezvous& rendezvous, const json& report,
                   const std::string& prefix) {
  auto key = [](int r) { return absl::StrCat("qualify/report/", r); };
  if (!rendezvous.Set(key(rendezvous.rank()), DumpJson(report)).ok() || rendezvous.rank() != 0) {
    return;
  }
  // One deadline for all of them (not a timeout per missing rank): a lost node's ranks must not
  // keep rank 0 past the job's deadline.
  const absl::Time deadline = absl::Now() + rendezvous.timeout();
  std::vector<bool> written(rendezvous.world_size(), false);
  written[0] = true;
  for (int left = rendezvous.world_size() - 1; left > 0 && absl::Now() < deadline;) {
    for (int r = 1; r < rendezvous.world_size(); ++r) {
      if (written[r]) continue;
      absl::StatusOr<bool> there = rendezvous.Check(key(r));
      if (!there.ok()) return;  // the store itself is gone
      if (!*there) continue;
      absl::StatusOr<std::string> other = rendezvous.Get(key(r));
      if (other.ok()) {
        const std::string path = absl::StrCat(prefix, r, ".json");
        if (absl::Status s = WriteFileAtomically(path, *other, WriteOptions{/*durable=*/false});
            !s.ok()) {
          LOCKSTEP_LOG(ERROR) << "qualify: rank " << r << "'s report: " << s;
        }
      }
      written[r] = true;
      --left;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// The largest report a rank writes: its checks' details and evidence, far below this.
constexpr size_t kMaxReportBytes = size_t{64} << 20;

// The report at `path`, or a non-object when there is none or it is not one (a rank stopped
// before writing leaves none; reports are written whole, so a part is never seen).
json ReadReport(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path, kMaxReportBytes);
  if (!text.ok()) return json();
  absl::StatusOr<json> report = ParseJson(*text, path);
  return report.ok() ? *std::move(report) : json();
}

// The reports `prefix`<r>.json of ranks 0..world-1; an empty object (and an error naming it)
// for a rank whose report is missing or unreadable.
std::vector<json> ReadReports(const std::string& prefix, int world,
                              std::vector<std::string>& errors) {
  std::vector<json> reports;
  for (int r = 0; r < world; ++r) {
    json report = ReadReport(absl::StrCat(prefix, r, ".json"));
    if (!report.is_object()) {
      errors.push_back(absl::StrCat("rank ", r, " wrote no report"));
      report = json::object();
    }
    reports.push_back(std::move(report));
  }
  return reports;
}

// Launches this node's processes of the second actor (on every node: the round's port is the
// job's port + 1, so that none of them can meet the first round's store); each compares its
// rank's two actors (CheckSecondActor). Returns why the round failed, or "".
std::string LaunchSecondActor(launch::LaunchOptions launch, const std::string& dir) {
  launch.command.push_back("--actor_round");
  if (launch.master_port != 0) ++launch.master_port;
  const std::string log_path = dir + "/workers.actor_b.log";
  FILE* log = std::fopen(log_path.c_str(), "w");
  std::string failure;
  if (log == nullptr) {
    failure = absl::StrCat(log_path, ": ", std::strerror(errno));
  } else {
    launch.output_fd = fileno(log);
    absl::StatusOr<launch::LaunchResult> second = launch::Launch(launch);
    std::fclose(log);
    if (!second.ok()) {
      failure = absl::StrCat("the second actor did not start: ", second.status().message());
    } else if (second->exit_code != 0) {
      failure = absl::StrCat("the second actor's processes failed: ", second->summary,
                             " (output in ", log_path, ")");
    }
  }
  return failure;
}

// What this node's ranks [first, first + count) said went wrong, from their reports in `dir`
// (the main round's, then the actors' round's): "rank R: error" lines. A node other than 0 prints
// them, so that its own output names the cause (a peer gone, the store unreachable) when node
// 0's table cannot be seen from it.
std::vector<std::string> NodeErrors(const std::string& dir, int first, int count) {
  std::vector<std::string> lines;
  const std::pair<const char*, const char*> rounds[] = {{"/rank", ""},
                                                        {"/actors.rank", "second actor, "}};
  for (const auto& [prefix, label] : rounds) {
    for (int r = first; r < first + count; ++r) {
      const json report = ReadReport(absl::StrCat(dir, prefix, r, ".json"));
      if (report.is_object() && report.contains("error") && report["error"].is_string()) {
        lines.push_back(absl::StrCat(label, "rank ", r, ": ", report["error"].get<std::string>()));
      }
    }
  }
  return lines;
}

// The "actors" check's entries, one per rank, from the second round's reports (or why a rank
// has none: its error, the round's `failure`, or no report).
std::vector<json> ActorsEntries(const std::string& dir, int world, const std::string& failure) {
  std::vector<std::string> missing;
  const std::vector<json> reports = ReadReports(dir + "/actors.rank", world, missing);
  std::vector<json> entries;
  for (int r = 0; r < world; ++r) {
    json entry = {{"name", "actors"}, {"rank", r}, {"passed", false}};
    const json& report = reports[r];
    if (report.contains("checks") && report["checks"].is_array() && !report["checks"].empty()) {
      entry = report["checks"][0];
      entry["rank"] = r;
    } else if (report.contains("error") && report["error"].is_string()) {
      entry["detail"] = report["error"].get<std::string>();
    } else {
      entry["detail"] = !failure.empty() ? failure : absl::StrCat("rank ", r, " wrote no report");
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

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
  if (options.inject_oom < 0 || options.inject_oom > kMaxInjectedOom) {
    return absl::InvalidArgumentError(absl::StrCat("--inject_oom ", options.inject_oom,
                                                   " is outside [0, ", kMaxInjectedOom, "]"));
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
  // cuBLAS is deterministic only with a fixed workspace, set before its first call (the
  // variability checks run in deterministic mode; an explicit setting is kept).
  if (options.device == "cuda") setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::set_num_threads(1);
  json report;
  std::shared_ptr<collectives::Rendezvous> rendezvous;
  const absl::Status status = [&]() -> absl::Status {
    // First, before any CUDA work (a contradicting setting fails the rank, naming it).
    report["deterministic_mode"] = options.deterministic;
    if (options.deterministic)
      LOCKSTEP_RETURN_IF_ERROR(numerics::EnforceDeterministicMode().status());
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
    GatherReports(*rendezvous, report, prefix);
  }
  if (!status.ok()) {
    LOCKSTEP_LOG(ERROR) << "qualify worker: " << status;
    return 1;
  }
  return 0;
}

namespace {

// Removes the job's directory: reports, ledgers, the actors' state and evidence (best effort).
// POSIX calls, not std::filesystem::remove_all, which crashed a process on the GPU machine's host
// (collectives/internal/host_lane_test.cc says more).
void RemoveDirectory(const std::string& dir, int) {
  nftw(
      dir.c_str(),
      [](const char* path, const struct stat*, int, struct FTW*) { return ::remove(path), 0; }, 16,
      FTW_DEPTH | FTW_PHYS);
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

absl::StatusOr<bool> RunQualify(const QualifyOptions& options, std::ostream& out) {
  LOCKSTEP_RETURN_IF_ERROR(ValidateQualifyOptions(options));
  LOCKSTEP_RETURN_IF_ERROR(ValidateQualifyMachine(
      options, static_cast<int>(std::thread::hardware_concurrency()), AvailableMemory()));
  const int world = options.dp * options.tp * options.cp;
  LOCKSTEP_RETURN_IF_ERROR(CheckRunnable(options));
  if (!options.evidence_path.empty()) {
    // Fail before the job runs, not after it, creating nothing under the evidence's name.
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
  std::string dir = absl::StrCat(TempDir::Root(), "/qualify.XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", dir, ": ", std::strerror(errno)));
  }
  const std::string log_path = absl::StrCat(dir, "/workers.log");
  FILE* log = std::fopen(log_path.c_str(), "w");
  if (log == nullptr) {
    const absl::Status error =
        absl::InternalError(absl::StrCat(log_path, ": ", std::strerror(errno)));
    RemoveDirectory(dir, world);
    return error;
  }
  launch::LaunchOptions launch;
  launch.nproc = world / options.nnodes;  // this node's ranks
  launch.nnodes = options.nnodes;
  launch.node_rank = options.node_rank;
  launch.master_addr = options.master_addr;
  launch.master_port = options.master_port;
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
  if (options.deterministic) launch.command.push_back("--deterministic");
  const std::string topology =
      absl::StrCat("DP", options.dp, " x TP", options.tp, " x CP", options.cp);
  const bool node_zero = options.node_rank == 0;
  const std::string where =
      options.nnodes == 1
          ? absl::StrCat(world, " local processes")
          : absl::StrCat(world, " processes on ", options.nnodes, " nodes; this is node ",
                         options.node_rank, ", ranks ", options.node_rank * launch.nproc, "..",
                         (options.node_rank + 1) * launch.nproc - 1);
  out << "qualify: " << topology << " (" << where
      << (options.device == "cuda"
              ? "; the trainer oracle on CUDA, over NCCL when there is a GPU per rank, else Gloo"
              : " over Gloo")
      << ")"
      << (options.control == NegativeControl::kNone
              ? ""
              : "  negative control: " + NegativeControlName(options.control))
      << std::endl;
  // Named before anything runs, so that a qualify killed outright has said where its workers'
  // output is; removed at the end when there is nothing in it to look into.
  out << "working directory: " << dir << " (removed at the end unless something fails)"
      << std::endl;
  LOCKSTEP_VLOG(1) << "qualify: launching " << world << " workers; their output goes to "
                   << log_path;
  absl::StatusOr<launch::LaunchResult> launched = launch::Launch(launch);
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
  json hosts = json::array();
  const std::vector<json> reports =
      node_zero ? ReadReports(dir + "/rank", world, errors) : std::vector<json>();
  for (int r = 0; r < static_cast<int>(reports.size()); ++r) {
    const json& report = reports[r];
    hosts.push_back(report.value("host", "?"));
    if (report.empty()) continue;
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

  // The actors check: a second round of processes, once the first saved the state they load
  // (on every node; node 0 reads every rank's result).
  std::string second_failure;
  if (!node_zero && launched->exit_code == 0) {
    second_failure = LaunchSecondActor(launch, dir);
  } else if (errors.empty() && launched->exit_code == 0 && per_check.count("repeatability")) {
    second_failure = LaunchSecondActor(launch, dir);
    per_check["actors"] = ActorsEntries(dir, world, second_failure);
    order.insert(std::find(order.begin(), order.end(), "repeatability") + 1, "actors");
  }
  if (!node_zero) {
    // Note [Reports across nodes]: node 0's qualify holds every rank's report and the verdict.
    const bool ran = launched->exit_code == 0 && second_failure.empty();
    out << "node " << options.node_rank << ": " << launched->summary
        << (second_failure.empty() ? "" : "; " + second_failure)
        << "; the table, the verdict and the evidence are node 0's\n";
    for (const std::string& line :
         NodeErrors(dir, options.node_rank * launch.nproc, launch.nproc)) {
      out << "error: " << line << "\n";
    }
    if (ran)
      RemoveDirectory(dir, world);
    else
      out << "worker output: " << dir << "\n";
    return ran;
  }

  out << "transport: " << transport << "\n\n"
      << absl::StrFormat("%-24s %-6s %-7s %s\n", "check", "result", "ranks", "detail (rank 0)");
  bool all_passed = errors.empty() && launched->exit_code == 0 && !order.empty();
  json evidence;
  evidence["topology"] = {{"dp", options.dp},
                          {"tp", options.tp},
                          {"cp", options.cp},
                          {"world", world},
                          {"nnodes", options.nnodes}};
  evidence["hosts"] = hosts;  // rank r's host name
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
    // The previous evidence stays whole until the new one is complete (file_io.h).
    if (absl::Status s = WriteFileAtomically(options.evidence_path, DumpJson(evidence, 2) + "\n");
        !s.ok()) {
      return absl::InternalError(absl::StrCat("cannot write the evidence file: ", s.message(),
                                              " (per-rank reports and worker output kept in ", dir,
                                              ")"));
    }
    out << "evidence: " << options.evidence_path << "\n";
  }
  if (!options.report_dir.empty()) {
    if (absl::Status s = WriteReport(evidence, options.report_dir); !s.ok()) {
      return absl::InternalError(absl::StrCat(
          "the report: ", s.message(), " (per-rank reports and worker output kept in ", dir, ")"));
    }
    out << "report: " << options.report_dir << "/index.html\n";
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
