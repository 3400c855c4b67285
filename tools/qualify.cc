// qualify: the main job. Runs a DP x TP x CP topology as local processes over Gloo and checks
// lockstep's contracts on every rank (qualification/qualification.h lists the checks), printing a
// table and writing JSON evidence. Exit 0: every check passed on every rank; 1: a check failed or a
// rank did not report; 2: bad flags or qualify could not run.
//
//   qualify --dp=2 --tp=1 --cp=2 [--out=evidence.json] [--negative_control=NAME]
//           [--inject_oom=N] [--device=cpu|cuda] [--timeout_seconds=S] [--report=DIR]
//           [--deterministic] [--placement_invariant]
//           [--nnodes=M --node_rank=K --master_addr=A --master_port=P]  (one qualify per node)

#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/tool_flags.h"
#include "qualification/negative_controls.h"
#include "qualification/qualification.h"

ABSL_FLAG(int, dp, 1, "data-parallel size");
ABSL_FLAG(int, tp, 1, "tensor-parallel size");
ABSL_FLAG(int, cp, 1, "context-parallel size");
ABSL_FLAG(lockstep::OutputPath, out, lockstep::OutputPath(),
          "where to write the JSON evidence (none when not given)");
ABSL_FLAG(std::string, negative_control, "",
          "a deliberate bug qualify must detect: no-sync, world-sync, unscoped-model-work, "
          "aliasing-snapshot, shard-local-philox, double-counted-retry, input-inside-scope, "
          "nondeterministic-op, ... (qualification/negative_controls.h lists them all)");
ABSL_FLAG(std::string, device, "cpu",
          "where the trainer's oracle runs: cpu, or cuda (each rank on GPU rank modulo the GPUs)");
ABSL_FLAG(int, inject_oom, 1,
          "out-of-memory failures the oom_recovery check injects on one replica of each TP x CP "
          "group (1..8)");
ABSL_FLAG(int, timeout_seconds, 120, "every collective's timeout in the workers");
ABSL_FLAG(bool, deterministic, false,
          "enforce lockstep's deterministic mode in every worker (numerics/deterministic_mode.h); "
          "a contradicting CUBLAS_WORKSPACE_CONFIG, NCCL_ALGO or NCCL_PROTO fails the run");
ABSL_FLAG(bool, placement_invariant, false,
          "run every worker under placement-invariant mode (invariant/mode.h): "
          "packing_invariance then fails on any difference between placements");
ABSL_FLAG(int64_t, deadline_seconds, 0,
          "the whole job's limit: workers still running then are named and stopped, and qualify "
          "fails (0: 3 x timeout + 60 s)");
ABSL_FLAG(std::string, report, "",
          "a directory for the HTML report (index.html, self-contained) and its evidence.json");
ABSL_FLAG(int, nnodes, 1, "nodes of a job across machines: one qualify per node");
ABSL_FLAG(int, node_rank, 0, "this node's index, 0..nnodes-1 (node 0 prints the verdict)");
ABSL_FLAG(std::string, master_addr, "127.0.0.1",
          "node 0's address, where rank 0 serves the rendezvous store");
ABSL_FLAG(int, master_port, 0,
          "the store's port (required with --nnodes > 1; the actors check also uses port + 1)");
ABSL_FLAG(bool, worker, false, "internal: run as one rank (started by qualify itself)");
ABSL_FLAG(bool, actor_round, false, "internal: a worker of the actors check's second actor");
ABSL_FLAG(std::string, results_dir, "", "internal: where a worker writes its report");

int main(int argc, char** argv) {
  namespace q = lockstep::qualification;
  using lockstep::kBadInputExitCode;
  const std::vector<std::string> args = lockstep::ParseToolFlags(
      argc, argv,
      "qualify --dp=N --tp=N --cp=N [--out=FILE] [--negative_control=NAME] [--inject_oom=N]: runs "
      "the topology "
      "as local processes and checks lockstep's contracts on every rank. Exit 0 pass, 1 fail, "
      "2 bad input.");
  auto fail = [](const absl::Status& status) {
    std::cerr << "qualify: " << status.message() << std::endl;
    return kBadInputExitCode;
  };
  if (absl::Status s = lockstep::NoPositionalArguments(args); !s.ok()) return fail(s);
  absl::StatusOr<q::NegativeControl> control =
      q::ParseNegativeControl(absl::GetFlag(FLAGS_negative_control));
  if (!control.ok()) return fail(control.status());
  q::QualifyOptions options = q::QualifyOptions::Topology(
      absl::GetFlag(FLAGS_dp), absl::GetFlag(FLAGS_tp), absl::GetFlag(FLAGS_cp));
  options.control = *control;
  options.inject_oom = absl::GetFlag(FLAGS_inject_oom);
  options.device = absl::GetFlag(FLAGS_device);
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds));
  options.evidence_path = absl::GetFlag(FLAGS_out).path;
  options.report_dir = absl::GetFlag(FLAGS_report);
  options.nnodes = absl::GetFlag(FLAGS_nnodes);
  options.node_rank = absl::GetFlag(FLAGS_node_rank);
  options.master_addr = absl::GetFlag(FLAGS_master_addr);
  options.master_port = absl::GetFlag(FLAGS_master_port);
  options.actor_round = absl::GetFlag(FLAGS_actor_round);
  options.deterministic = absl::GetFlag(FLAGS_deterministic);
  options.placement_invariant = absl::GetFlag(FLAGS_placement_invariant);
  if (const int64_t deadline = absl::GetFlag(FLAGS_deadline_seconds); deadline != 0) {
    options.deadline = absl::Seconds(deadline);
  }
  if (absl::Status s = q::ValidateQualifyOptions(options); !s.ok()) return fail(s);
  if (absl::GetFlag(FLAGS_worker)) {
    if (absl::GetFlag(FLAGS_results_dir).empty()) {
      return fail(absl::InvalidArgumentError("--worker needs --results_dir"));
    }
    return q::RunWorker(options, absl::GetFlag(FLAGS_results_dir));
  }
  absl::StatusOr<bool> passed = q::RunQualify(options, std::cout);
  if (!passed.ok()) return fail(passed.status());
  return *passed ? 0 : 1;
}
