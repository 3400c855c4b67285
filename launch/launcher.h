// launch/launcher.h
//
// The library behind tools/launch: starts N local processes of one command with the torchrun
// environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// GROUP_RANK, GROUP_WORLD_SIZE) — the ranks of one node of a job of `nnodes` nodes, one launch
// per node, as torchrun's static multi-node rendezvous numbers them (node K's ranks are
// K x nproc .. K x nproc + nproc - 1; the ranks' own rendezvous joins the nodes and names the
// ranks and nodes that never arrive) —
// forwards their output line by line with a "[rank K] " prefix, and when one fails stops the
// others (SIGTERM to each process group, SIGKILL after a grace period) and reports the failure.
// SIGINT/SIGTERM sent to the launcher are forwarded to the ranks the same way. A job-level
// deadline bounds the whole run: ranks still running then are named, stopped, and the job
// fails. Ranks die with the launcher (PR_SET_PDEATHSIG), so a killed launcher leaves none.
//
// Thread-safety: Launch installs signal handlers for its duration; run one at a time.
//
// Example:
//   LaunchOptions options;
//   options.nproc = 4;
//   options.command = {"bazel-bin/tools/collectives_demo", "--cp=2"};
//   absl::StatusOr<LaunchResult> result = Launch(options);
//   return result.ok() ? result->exit_code : 2;

#ifndef LOCKSTEP_LAUNCH_LAUNCHER_H_
#define LOCKSTEP_LAUNCH_LAUNCHER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace lockstep {
namespace launch {

// The most processes launch starts on one machine.
inline constexpr int kMaxLocalProcesses = 1024;
// The most nodes of one job.
inline constexpr int kMaxNodes = 1024;

// What Launch starts, and how it stops it (see the top of this file).
struct LaunchOptions {
  // Number of processes on this node; 1..kMaxLocalProcesses. Default: 1.
  int nproc = 1;
  // Nodes of the job, 1..kMaxNodes. Default: 1.
  int nnodes = 1;
  // This node's index among them, in [0, nnodes): its ranks are node_rank x nproc onwards.
  // Default: 0.
  int node_rank = 0;
  // Address of rank 0's rendezvous store. Default: the loopback address.
  std::string master_addr = "127.0.0.1";
  // Its port; 0 picks a free one (one node only: every node must be given the same port).
  // Default: 0.
  int master_port = 0;
  // The program and its arguments; the program is looked up on PATH.
  std::vector<std::string> command;
  // How long the others get between SIGTERM and SIGKILL once one rank failed. Default: 5 s.
  absl::Duration grace = absl::Seconds(5);
  // The whole job's limit: ranks still running then are stopped and named. Default: none.
  absl::Duration deadline = absl::InfiniteDuration();
  // Where the prefixed output goes. Default: standard output.
  int output_fd = 1;
};

// How the ranks of a Launch ended.
struct LaunchResult {
  // 0 when every rank exited 0; else the first failing rank's exit code, or 128 + signal.
  int exit_code = 0;
  // The first rank that failed (its global rank), or -1.
  int failed_rank = -1;
  // Ranks (global) stopped because the deadline passed (empty otherwise).
  std::vector<int> stalled_ranks;
  // What happened, for the launcher's last line ("rank 1 exited with code 3").
  std::string summary;
};

// kInvalidArgument naming the option (as launch's flag) and its accepted range for: nproc
// outside [1, kMaxLocalProcesses], nnodes outside [1, kMaxNodes], node_rank outside
// [0, nnodes), an empty master_addr, master_port outside [0, 65535] (or 0 with more than one
// node), a negative grace, a non-positive deadline, an empty command.
absl::Status ValidateLaunchOptions(const LaunchOptions& options);

// Runs the processes to completion. Returns an error only when the launcher itself could not
// work (bad options, no pipe, no fork); failures of the ranks are in the result.
absl::StatusOr<LaunchResult> Launch(const LaunchOptions& options);

}  // namespace launch
}  // namespace lockstep

#endif  // LOCKSTEP_LAUNCH_LAUNCHER_H_
