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

// One check's verdict on one rank, as the table and the evidence JSON report it.
struct CheckResult {
  // The check's name in the table and the evidence ("replica_agreement", "oom_recovery", ...).
  std::string name;
  // Whether the check passed on this rank.
  bool passed = false;
  // What the check found: its figures on a pass, what broke on a failure.
  std::string detail;
  // The figures behind the verdict, where a check has more than its detail (the variability
  // checks); null otherwise. Goes into the evidence JSON and the report.
  nlohmann::json evidence;

  // A result of `name`, `passed` and `detail`, with no evidence.
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
  // A setup over `groups`, the rest at the defaults below (SetUpRank fills it in).
  explicit RankSetup(collectives::RankGroups groups) : groups(std::move(groups)) {}

  // The world (borrowed: SetUpRank's precondition) and the rank's groups in it.
  collectives::RankGroups groups;
  // The rank's RNG streams over its default CPU generator.
  std::shared_ptr<rng::RankStreams> streams;
  // The negative control the checks plant (kNone: none). Default: kNone.
  NegativeControl control = NegativeControl::kNone;
  // The caller state right after SetUpRank's synchronization, which the checks rewind to;
  // nullopt until SetUpRank sets it.
  std::optional<rng::RngSnapshot> synced;
  // Out-of-memory failures oom_recovery injects, 1..kMaxInjectedOom (none: the check fails, as
  // it would prove nothing). Default: 1.
  int inject_oom = 1;
  // Where oom_recovery writes the rank's ledger (empty: a temporary directory), and where the
  // variability checks keep the actors' state and evidence (empty: no actors). Default: empty.
  std::string ledger_dir;
  // Where the trainer's oracle runs: "cpu" or "cuda" (the rank's GPU: rank modulo the GPUs).
  std::string device = "cpu";
};

// Seeds the rank's default generators differently on every rank (as after independent data
// loading), creates its groups and synchronizes its TP x CP group (per `control`). Collective.
// Precondition: `world` outlives the RankSetup.
absl::StatusOr<RankSetup> SetUpRank(collectives::Communicator& world,
                                    const collectives::Topology& topology, NegativeControl control);

// The checks (see the top of this file); each starts from setup.synced and is collective over
// the world.

// replica_agreement: every replica draws what its TP x CP group's leader draws.
absl::StatusOr<CheckResult> CheckReplicaAgreement(RankSetup& setup);
// dp_workers_independent: no DP worker draws what DP worker 0 draws (passes with one DP worker).
absl::StatusOr<CheckResult> CheckDpWorkersIndependent(RankSetup& setup);
// model_stream: two model-stream scopes leave the caller's draws untouched, the stream advances
// from one to the next, and the replicas' model masks agree.
absl::StatusOr<CheckResult> CheckModelStream(RankSetup& setup);
// exception_restoration: an exception thrown through a model-stream scope, and an error returned
// from inside one, each leave the caller's generators (CPU, and the rank's CUDA generator with
// setup.device "cuda") bit-exact.
absl::StatusOr<CheckResult> CheckExceptionRestoration(RankSetup& setup);
// partition_invariance: the TP x CP shards of a Philox dropout mask reassemble to the unsharded
// mask.
absl::StatusOr<CheckResult> CheckPartitionInvariance(RankSetup& setup);
// checkpoint_recompute: a checkpointed MLP block with dropout against the plain block (mask
// replayed, gradients bit-identical, caller untouched, nothing retained, replicas agree).
absl::StatusOr<CheckResult> CheckRecompute(RankSetup& setup);
// oom_recovery: setup.inject_oom out-of-memory failures on one replica of each TP x CP group,
// recovered by admission's RecoveringRunner to the gradient of the run without failures, with
// every token counted once in the rank's ledger (written under setup.ledger_dir).
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

// What RunQualify runs: the topology, the negative control, the device, limits, and where the
// evidence and report go. Made by Topology, then set field by field (qualify: from its flags).
struct QualifyOptions {
  // A DP x TP x CP topology; the other options at their defaults.
  static QualifyOptions Topology(int dp, int tp, int cp) {
    QualifyOptions options;
    options.dp = dp;
    options.tp = tp;
    options.cp = cp;
    return options;
  }

  int dp = 1,  // DP workers, 1..kMaxQualifyWorld (with dp x tp x cp at most that). Default: 1.
      tp = 1,  // TP size, 1..kMaxQualifyWorld. Default: 1.
      cp = 1;  // CP size, 1..kMaxQualifyWorld. Default: 1.
  // Where to write the JSON evidence; empty: nowhere. Default: empty.
  std::string evidence_path;
  // The negative control to plant (negative_controls.h); qualify must then fail. Default: kNone.
  NegativeControl control = NegativeControl::kNone;
  // Out-of-memory failures oom_recovery injects, 1..kMaxInjectedOom. Default: 1.
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
  int node_rank = 0;                      // this node's index, in [0, nnodes); node 0 reports
  std::string master_addr = "127.0.0.1";  // the host of rank 0's rendezvous store
  int master_port = 0;                    // its port (0: a free one; required across nodes)
  // Internal (workers): run only the second actor of the actors check. Default: false.
  bool actor_round = false;
  // Enforce lockstep's deterministic mode (numerics/deterministic_mode.h) in every worker before
  // its first CUDA work; the variability checks' evidence says whether it held. A contradicting
  // setting in the environment fails the worker naming it. Default: false.
  bool deterministic = false;
  // Run every worker under placement-invariant mode (invariant/mode.h): the reference model
  // computes with invariant/ops.h's kernels, and packing_invariance fails on any difference
  // between placements. Default: false.
  bool placement_invariant = false;

 private:
  QualifyOptions() = default;
};

// The job deadline derived from the collective timeout: 3 x timeout + 60 s (set-up, the checks'
// few dozen collectives, and reporting all fit well within it).
absl::Duration DefaultDeadline(absl::Duration timeout);

// kInvalidArgument naming the flag and the limit for a non-positive size, a world over
// kMaxQualifyWorld (or one whose product overflows), a non-positive timeout or deadline, an
// --inject_oom outside [1, kMaxInjectedOom], a --device other than cpu and cuda, or across nodes
// a --node_rank outside [0, nnodes), a world that nnodes does not divide, or no --master_port.
absl::Status ValidateQualifyOptions(const QualifyOptions& options);

// What a qualify worker needs of the machine: at most kProcessesPerCore workers per core, and
// kBytesPerWorker of available memory each. kResourceExhausted naming the flags, the machine's
// figure and the limit otherwise.
inline constexpr int kProcessesPerCore = 16;
// The available memory each qualify worker needs: 256 MiB.
inline constexpr int64_t kBytesPerWorker = int64_t{256} << 20;
// Checks this node's dp * tp * cp / nnodes workers against its `cores` (kProcessesPerCore each)
// and `available_bytes` (kBytesPerWorker each; negative: unknown, not checked), as above.
absl::Status ValidateQualifyMachine(const QualifyOptions& options, int cores,
                                    int64_t available_bytes);

// The checks RunQualify's verdict requires from every rank of `options`' topology, in the
// table's order: sixteen, or fifteen at CP 1 (no empty_cp_shard). A check that no rank, or not
// every rank, reported fails the verdict, so a family of checks that stops reporting cannot pass.
std::vector<std::string> ExpectedChecks(const QualifyOptions& options);

// Launches dp * tp * cp workers (the executable with --worker), collects their reports, prints
// the table to `out`, writes the evidence, and returns whether every expected check
// (ExpectedChecks) passed on every rank. An error when qualify itself could not run (bad options,
// no processes, unwritable evidence path).
absl::StatusOr<bool> RunQualify(const QualifyOptions& options, std::ostream& out);

// The HTML report of `evidence` (RunQualify's JSON): writes it to `dir`/evidence.json and the
// page of report/report.py (embedded in this library; run with Debian's /usr/bin/python3,
// isolated from the user's environment and from `dir`) to `dir`/index.html, creating `dir`. An
// error only when the evidence cannot be written; a page that could not be drawn, or was drawn
// with a warning (no matplotlib: no plots), returns the warning's text, else "".
absl::StatusOr<std::string> WriteReport(const nlohmann::json& evidence, const std::string& dir);

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
