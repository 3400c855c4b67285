// qualification/qualification.h
//
// The qualification library behind `qualify`, lockstep's main job: it runs a DP x TP x CP
// topology as local processes over Gloo and checks lockstep's contracts on every rank, then
// reports a table and JSON evidence. The checks are library functions so that each can be unit
// tested with its negative control (negative_controls.h); the qualify binary only parses flags
// and calls RunQualify.
//
// Checks (each runs on every rank, collectively over the world):
//   replica_agreement       after Synchronize on the TP x CP group, every replica of a DP worker
//                           draws the same uniforms, dropout mask and token mask as its group
//                           leader (whose global rank need not be 0)
//   dp_workers_independent  differently seeded DP workers keep different draws
//   model_stream            the caller's state is untouched by model-stream scopes, the model
//                           stream advances between scopes, and model masks agree across replicas
//   exception_restoration   an exception inside a scope still restores the caller exactly
//   partition_invariance    TP column x CP zigzag shards of a Philox dropout mask, gathered over
//                           the TP x CP group, reassemble to the unsharded mask
//   checkpoint_recompute    a checkpointed MLP block with dropout: the recompute's mask equals the
//                           forward's, input and parameter gradients are bit-identical to the
//                           plain block's, the caller's draws and live generator are untouched,
//                           nothing is retained after backward, and the replicas' gradients agree
//   oom_recovery            a step of a toy objective over a planned batch, run through
//                           admission's RecoveringRunner with N out-of-memory failures injected
//                           on one replica of each TP x CP group (after its backward, so a partial
//                           contribution must be dropped): every replica splits the same way, the
//                           group's gradient equals the run without failures (1e-6 relative), and
//                           the rank's ledger shows every token counted once (its summary is in
//                           the detail)
//   trainer checks          the trainer's oracle (qualification/oracle.h): replica_outputs,
//                           caller_draws, stream_progression, reference_match (split run vs the
//                           unsplit reference through two accumulated forwards per Adam step and
//                           two Adam steps, with numerics' figures), empty_cp_shard (CP > 1)
//
// Thread-safety: the rank checks use the process's default generators (one thread per process).
//
// Example:
//   qualification::QualifyOptions options = qualification::QualifyOptions::Topology(2, 1, 2);
//   options.evidence_path = "qualify.json";
//   absl::StatusOr<bool> passed = qualification::RunQualify(options, std::cout);

#ifndef LOCKSTEP_QUALIFICATION_QUALIFICATION_H_
#define LOCKSTEP_QUALIFICATION_QUALIFICATION_H_

#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "c10/core/Device.h"
#include "collectives/communicator.h"
#include "collectives/rank_groups.h"
#include "collectives/topology.h"
#include "nlohmann/json.hpp"
#include "qualification/negative_controls.h"
#include "rng/rank_streams.h"
#include "rng/snapshot.h"

namespace lockstep {
namespace qualification {

struct CheckResult {
  std::string name;
  bool passed = false;
  std::string detail;
  // The figures behind the verdict, where a check has more than its detail (the variability
  // checks); null otherwise. Goes into the evidence JSON and the report.
  nlohmann::json evidence;

  static CheckResult Make(std::string name, bool passed, std::string detail) {
    CheckResult result;
    result.name = std::move(name);
    result.passed = passed;
    result.detail = std::move(detail);
    return result;
  }
};

// One rank's state for the checks: its groups, its streams, and the caller state the checks
// start from (synchronized across the TP x CP group unless a negative control says otherwise).
struct RankSetup {
  explicit RankSetup(collectives::RankGroups groups) : groups(std::move(groups)) {}

  // The world (borrowed: SetUpRank's precondition) and the rank's groups in it.
  collectives::RankGroups groups;
  std::shared_ptr<rng::RankStreams> streams;
  NegativeControl control = NegativeControl::kNone;
  std::optional<rng::RngSnapshot> synced;
  // oom_recovery: failures to inject, and where the rank's ledger goes (empty: a temporary file).
  int inject_oom = 1;
  std::string ledger_dir;
  // Where the trainer's oracle runs: "cpu" or "cuda" (the rank's GPU: rank modulo the GPUs).
  std::string device = "cpu";
};

// Seeds the rank's default generators differently on every rank (as after independent data
// loading), creates its groups and synchronizes its TP x CP group (per `control`). Collective.
// Precondition: `world` outlives the RankSetup.
absl::StatusOr<RankSetup> SetUpRank(collectives::Communicator& world,
                                    const collectives::Topology& topology, NegativeControl control);

// The checks; each starts from setup.synced and is collective over the world.
absl::StatusOr<CheckResult> CheckReplicaAgreement(RankSetup& setup);
absl::StatusOr<CheckResult> CheckDpWorkersIndependent(RankSetup& setup);
absl::StatusOr<CheckResult> CheckModelStream(RankSetup& setup);
absl::StatusOr<CheckResult> CheckExceptionRestoration(RankSetup& setup);
absl::StatusOr<CheckResult> CheckPartitionInvariance(RankSetup& setup);
absl::StatusOr<CheckResult> CheckRecompute(RankSetup& setup);
absl::StatusOr<CheckResult> CheckOomRecovery(RankSetup& setup);
// The trainer's oracle, under the negative control that targets it (if any).
absl::StatusOr<std::vector<CheckResult>> CheckTrainer(RankSetup& setup);
// The variability checks (qualification/variability.h): repeatability and
// packing_invariance; with setup.ledger_dir given, also the state the actors load
// (<dir>/actor_state) and the first actor's evidence (<dir>/actor_a), for the driver's actors
// check.
absl::StatusOr<std::vector<CheckResult>> CheckVariability(RankSetup& setup);
// The actors check's second round (processes of their own, after CheckVariability's round): the
// second actor loads <setup.ledger_dir>/actor_state, writes <dir>/actor_b, and each rank compares
// its two actors. Collective.
absl::StatusOr<CheckResult> CheckSecondActor(RankSetup& setup);

// Where the trainer's checks run: the CPU, or (--device cuda) the GPU of the rank's LOCAL_RANK
// (its global rank when unset) modulo the node's GPUs.
// kFailedPrecondition when cuda is asked of a build or machine without a CUDA device.
absl::StatusOr<c10::Device> RankDevice(const RankSetup& setup);

// The most failures --inject_oom may ask for (each halves a microbatch of the check's plan).
inline constexpr int kMaxInjectedOom = 8;

// The largest world qualify runs: local processes on one machine.
inline constexpr int kMaxQualifyWorld = 64;

class QualifyOptions {
 public:
  // A DP x TP x CP topology; the other options at their defaults.
  static QualifyOptions Topology(int dp, int tp, int cp) {
    QualifyOptions options;
    options.dp = dp;
    options.tp = tp;
    options.cp = cp;
    return options;
  }

  int dp = 1, tp = 1, cp = 1;
  // Where to write the JSON evidence; empty: nowhere. Default: empty.
  std::string evidence_path;
  NegativeControl control = NegativeControl::kNone;
  // Out-of-memory failures oom_recovery injects, 0..kMaxInjectedOom. Default: 1.
  int inject_oom = 1;
  // Where the trainer's oracle runs: "cpu" (default) or "cuda" (the ranks' processes over Gloo,
  // each on GPU rank modulo the number of GPUs; a build with CUDA support and a GPU required).
  std::string device = "cpu";
  // Every collective's timeout in the workers. Default: 120 s.
  absl::Duration timeout = absl::Seconds(120);
  // The whole job's limit: workers still running then are named, stopped, and qualify fails.
  // Default: DefaultDeadline(timeout).
  std::optional<absl::Duration> deadline;
  // The qualify executable the workers run. Default: this process's own executable.
  std::string executable = "/proc/self/exe";
  // Where RunQualify writes the HTML report (report): empty, nowhere. Default: empty.
  std::string report_dir;
  // A job across nodes (launch's and torchrun's convention): `nnodes` nodes each running one
  // qualify with its `node_rank`, dp x tp x cp / nnodes ranks each, meeting at
  // master_addr:master_port (the actors check's second round at master_port + 1). Node 0 prints
  // the table and writes the evidence and report; the others run their ranks and say how they
  // ended. Defaults: one node, 127.0.0.1, a free port.
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // Internal (workers): run only the second actor of the actors check. Default: false.
  bool actor_round = false;
  // Enforce lockstep's deterministic mode (numerics/deterministic_mode.h) in every worker before
  // its first CUDA work; the variability checks' evidence says whether it held. A contradicting
  // setting in the environment fails the worker naming it. Default: false.
  bool deterministic = false;

 private:
  QualifyOptions() = default;
};

// The job deadline derived from the collective timeout: 3 x timeout + 60 s (set-up, the checks'
// few dozen collectives, and reporting all fit well within it).
absl::Duration DefaultDeadline(absl::Duration timeout);

// kInvalidArgument naming the flag and the limit for a non-positive size, a world over
// kMaxQualifyWorld (or one whose product overflows), a non-positive timeout or deadline, an
// --inject_oom outside [0, kMaxInjectedOom], a --device other than cpu and cuda, or across nodes
// a --node_rank outside [0, nnodes), a world that nnodes does not divide, or no --master_port.
absl::Status ValidateQualifyOptions(const QualifyOptions& options);

// What a qualify worker needs of the machine: at most kProcessesPerCore workers per core, and
// kBytesPerWorker of available memory each. kResourceExhausted naming the flags, the machine's
// figure and the limit otherwise.
inline constexpr int kProcessesPerCore = 16;
inline constexpr int64_t kBytesPerWorker = int64_t{256} << 20;
absl::Status ValidateQualifyMachine(const QualifyOptions& options, int cores,
                                    int64_t available_bytes);

// Launches dp * tp * cp workers (the executable with --worker), collects their reports, prints
// the table to `out`, writes the evidence, and returns whether every check passed on every
// rank. An error when qualify itself could not run (bad options, no processes, unwritable
// evidence path).
absl::StatusOr<bool> RunQualify(const QualifyOptions& options, std::ostream& out);

// The HTML report of `evidence` (RunQualify's JSON): writes it to `dir`/evidence.json and the
// page of report/report.py (embedded in this library; run with Debian's /usr/bin/python3
// and python3-matplotlib) to `dir`/index.html, creating `dir`. kInternal with the script's output
// when it fails.
absl::Status WriteReport(const nlohmann::json& evidence, const std::string& dir);

// Every check above, in that order, then a barrier, as `options` ask (its control, inject_oom and
// device; its topology is `topology`'s). The ledgers of oom_recovery go to `ledger_dir` (empty: a
// temporary file each).
absl::StatusOr<std::vector<CheckResult>> RunRankChecks(collectives::Communicator& world,
                                                       const collectives::Topology& topology,
                                                       const QualifyOptions& options,
                                                       const std::string& ledger_dir = "");

// A worker: joins the world from the torchrun environment, runs the checks `options` ask for,
// writes its report to `results_dir`/rank<RANK>.json. Returns the process's exit code.
int RunWorker(const QualifyOptions& options, const std::string& results_dir);

}  // namespace qualification
}  // namespace lockstep

#endif  // LOCKSTEP_QUALIFICATION_QUALIFICATION_H_
