// launch: starts N local processes with the torchrun environment.
//
//   launch [--nproc=N] [--master_addr=A] [--master_port=P] [--grace_seconds=S]
//          [--deadline_seconds=D] -- PROGRAM [ARGS...]
//
// Each process gets MASTER_ADDR, MASTER_PORT (a free port by default), RANK, WORLD_SIZE,
// LOCAL_RANK and LOCAL_WORLD_SIZE; its output is forwarded with a "[rank K] " prefix. When a
// rank fails, the others are stopped and launch exits with the failing rank's exit code; after
// --deadline_seconds the ranks still running are named and stopped and launch exits 124. Exit
// 2: bad flags.

#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "base/tool_flags.h"
#include "tools/launcher.h"

ABSL_FLAG(int, nproc, 1, "number of processes, 1..1024");
ABSL_FLAG(std::string, master_addr, "127.0.0.1", "address of rank 0's rendezvous store");
ABSL_FLAG(int, master_port, 0, "its port; 0 picks a free one");
ABSL_FLAG(int, grace_seconds, 5,
          "seconds the other ranks get between SIGTERM and SIGKILL once one failed");
ABSL_FLAG(int64_t, deadline_seconds, 0,
          "the whole job's limit in seconds; ranks still running then are named and stopped "
          "(0: none)");

int main(int argc, char** argv) {
  using lockstep::kBadInputExitCode;
  std::vector<std::string> program = lockstep::ParseToolFlags(
      argc, argv,
      "launch [FLAGS] -- PROGRAM [ARGS...]: starts N local processes of PROGRAM with the "
      "torchrun environment, output prefixed by rank");
  lockstep::tools::LaunchOptions options;
  options.nproc = absl::GetFlag(FLAGS_nproc);
  options.master_addr = absl::GetFlag(FLAGS_master_addr);
  options.master_port = absl::GetFlag(FLAGS_master_port);
  options.grace = absl::Seconds(absl::GetFlag(FLAGS_grace_seconds));
  const int64_t deadline = absl::GetFlag(FLAGS_deadline_seconds);
  if (deadline < 0) {
    std::cerr << "launch: --deadline_seconds " << deadline << " must not be negative\n";
    return kBadInputExitCode;
  }
  options.deadline = deadline == 0 ? absl::InfiniteDuration() : absl::Seconds(deadline);
  options.command = program;
  if (absl::Status s = lockstep::tools::ValidateLaunchOptions(options); !s.ok()) {
    std::cerr << "launch: " << s.message() << "\n";
    return kBadInputExitCode;
  }
  absl::StatusOr<lockstep::tools::LaunchResult> result = lockstep::tools::Launch(options);
  if (!result.ok()) {
    std::cerr << "launch: " << result.status().message() << "\n";
    return kBadInputExitCode;
  }
  std::cout << "[launch] " << result->summary << std::endl;
  return result->exit_code;
}
