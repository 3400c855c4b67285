#include "tools/qualification.h"

#include "tools/qualification/checks_internal.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
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
#include "base/temp_dir.h"
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
#include "trainer/qualification/variability.h"

namespace lockstep {
namespace qualification {
namespace {

using collectives::Communicator;
using collectives::Topology;
using nlohmann::json;

constexpr char kActorState[] = "/actor_state";
constexpr char kFirstActor[] = "/actor_a";
constexpr char kSecondActor[] = "/actor_b";

// The second actor of the actors check: in processes of its own, it loads the state the first
// round saved and runs the step (trainer/qualification/variability.h).
absl::Status RunSecondActor(Communicator& world, const Topology& topology,
                            const QualifyOptions& options, const std::string& results_dir) {
  RankSetup setup(world, topology);
  setup.device = options.device;
  LOCKSTEP_ASSIGN_OR_RETURN(const c10::Device device, RankDevice(setup));
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::unique_ptr<trainer::VariabilityRank> rank,
      trainer::VariabilityRank::Create(world, topology,
                                       options.control == NegativeControl::kNondeterministicOp
                                           ? trainer::VariabilityControl::kNondeterministicOp
                                           : trainer::VariabilityControl::kNone,
                                       device));
  LOCKSTEP_RETURN_IF_ERROR(rank->RunActor(results_dir + kActorState, results_dir + kSecondActor));
  return world.Barrier();
}

// Launches the second actor's processes and compares each rank's two actors: the "actors"
// check's entries, one per rank (failed, with the reason, when the second actor did not run).
std::vector<json> ActorsCheck(tools::LaunchOptions launch, const std::string& dir, int world) {
  launch.command.push_back("--actor_round");
  const std::string log_path = dir + "/workers.actor_b.log";
  FILE* log = std::fopen(log_path.c_str(), "w");
  std::string failure;
  if (log == nullptr) {
    failure = absl::StrCat(log_path, ": ", std::strerror(errno));
  } else {
    launch.output_fd = fileno(log);
    absl::StatusOr<tools::LaunchResult> second = tools::Launch(launch);
    std::fclose(log);
    if (!second.ok()) {
      failure = absl::StrCat("the second actor did not start: ", second.status().message());
    } else if (second->exit_code != 0) {
      failure = absl::StrCat("the second actor's processes failed: ", second->summary,
                             " (output in ", log_path, ")");
    }
  }
  std::vector<json> entries;
  for (int r = 0; r < world; ++r) {
    json entry = {{"name", "actors"}, {"rank", r}, {"passed", false}};
    if (!failure.empty()) {
      entry["detail"] = failure;
    } else if (absl::StatusOr<trainer::VariabilityCheck> check =
                   trainer::CompareActors(dir + kFirstActor, dir + kSecondActor, r);
               !check.ok()) {
      entry["detail"] = absl::StrCat("the actors' evidence: ", check.status().message());
    } else {
      entry["passed"] = check->passed;
      entry["detail"] = check->detail;
      entry["evidence"] = check->evidence;
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

int RunWorker(const QualifyOptions& options, const std::string& results_dir) {
  const absl::Duration timeout = options.timeout;
  // cuBLAS is deterministic only with a fixed workspace, set before its first call (the
  // variability checks run in deterministic mode; an explicit setting is kept).
  if (options.device == "cuda") setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::set_num_threads(1);
  json report;
  const absl::Status status = [&]() -> absl::Status {
    LOCKSTEP_ASSIGN_OR_RETURN(auto rendezvous, collectives::Rendezvous::FromEnvironment(timeout));
    std::unique_ptr<Communicator> world;
    std::string transport = "gloo";
#if LOCKSTEP_BUILT_WITH_CUDA
    // --device cuda with a GPU for every rank: NCCL, one GPU per rank (its local rank).
    if (options.device == "cuda" && at::hasCUDA() &&
        static_cast<int64_t>(at::getNumGPUs()) >= rendezvous->world_size()) {
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
    if (options.actor_round) return RunSecondActor(*world, topo, options, results_dir);
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<CheckResult> results,
                              RunRankChecks(*world, topo, options, results_dir));
    for (const CheckResult& r : results) {
      json check = {{"name", r.name}, {"passed", r.passed}, {"detail", r.detail}};
      if (!r.evidence.is_null()) check["evidence"] = r.evidence;
      report["checks"].push_back(std::move(check));
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

// Removes the job's directory: reports, ledgers, the actors' state and evidence (best effort).
void RemoveDirectory(const std::string& dir, int) {
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
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

  // The actors check: a second round of processes, once the first saved the state they load.
  if (errors.empty() && launched->exit_code == 0 && per_check.count("repeatability")) {
    per_check["actors"] = ActorsCheck(launch, dir, world);
    order.insert(std::find(order.begin(), order.end(), "repeatability") + 1, "actors");
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
