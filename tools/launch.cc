// launch: starts N local processes with the torchrun environment.
//
//   launch [--nproc N] [--master_addr A] [--master_port P] [--grace_seconds S] [--] PROGRAM [ARGS]
//
// Each process gets MASTER_ADDR, MASTER_PORT (a free port by default), RANK, WORLD_SIZE,
// LOCAL_RANK and LOCAL_WORLD_SIZE; its output is forwarded with a "[rank K] " prefix. When a
// rank fails, the others are stopped and launch exits with the failing rank's exit code.

#include <iostream>
#include <string>
#include <vector>

#include "tools/launcher.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<lockstep::tools::LaunchOptions> options = lockstep::tools::ParseLaunchArgs(args);
  if (!options.ok()) {
    std::cerr << "launch: " << options.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<lockstep::tools::LaunchResult> result = lockstep::tools::Launch(*options);
  if (!result.ok()) {
    std::cerr << "launch: " << result.status().message() << "\n";
    return 2;
  }
  std::cout << "[launch] " << result->summary << std::endl;
  return result->exit_code;
}
