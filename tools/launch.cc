// launch: starts the processes of one node of a job with the torchrun environment.
//
//   launch [--nproc=N] [--nnodes=M --node_rank=K] [--master_addr=A] [--master_port=P]
//          [--grace_seconds=S] [--deadline_seconds=D] -- PROGRAM [ARGS...]
//
// Each process gets MASTER_ADDR, MASTER_PORT (a free port by default on one node), RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK and GROUP_WORLD_SIZE; its output is
// forwarded with a "[rank K] " prefix (K the global rank). A job of M nodes is one launch per node
// with the same --nnodes, --nproc, --master_addr and --master_port and its own --node_rank. The
// flags may instead come from torchrun's variables (PET_NNODES, PET_NODE_RANK,
// PET_NPROC_PER_NODE, PET_MASTER_ADDR, PET_MASTER_PORT) or, for the address and port, from
// MASTER_ADDR and MASTER_PORT as a scheduler exports them; a flag given wins. --nproc_per_node is
// torchrun's name for --nproc. When a rank fails, the others are stopped and launch exits with the
// failing rank's exit code; after --deadline_seconds the ranks still running are named and
// stopped and launch exits 124. Exit 2: bad flags.

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/tool_flags.h"
#include "launch/launcher.h"

ABSL_FLAG(int, nproc, -1, "processes on this node, 1..1024 (default: PET_NPROC_PER_NODE or 1)");
ABSL_FLAG(int, nproc_per_node, -1, "torchrun's name for --nproc");
ABSL_FLAG(int, nnodes, -1, "nodes of the job, 1..1024 (default: PET_NNODES or 1)");
ABSL_FLAG(int, node_rank, -1, "this node's index, 0..nnodes-1 (default: PET_NODE_RANK or 0)");
// Not a host name: stands for "not given" (an explicitly empty address is refused).
constexpr char kFromEnvironment[] = "(environment)";
ABSL_FLAG(std::string, master_addr, kFromEnvironment,
          "address of rank 0's rendezvous store (default: PET_MASTER_ADDR, MASTER_ADDR or "
          "127.0.0.1)");
ABSL_FLAG(int, master_port, -1,
          "its port (default: PET_MASTER_PORT, MASTER_PORT, or on one node a free one)");
ABSL_FLAG(int, grace_seconds, 5,
          "seconds the other ranks get between SIGTERM and SIGKILL once one failed");
ABSL_FLAG(int64_t, deadline_seconds, 0,
          "the whole job's limit in seconds; ranks still running then are named and stopped "
          "(0: none)");

namespace {

// The first of `names` set in the environment.
std::optional<std::string> FromEnvironment(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') {
      return std::string(value);
    }
  }
  return std::nullopt;
}

// `flag` when given (not `unset`), else the first variable of `names` (which must be an
// integer), else `fallback`. Sets `error` naming the variable and its value when it is not one.
int IntSetting(int flag, int unset, std::initializer_list<const char*> names, int fallback,
               std::string& error) {
  if (flag != unset) return flag;
  for (const char* name : names) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    int parsed = 0;
    if (!absl::SimpleAtoi(value, &parsed)) {
      error = absl::StrCat(name, "='", value, "' is not an integer");
      return fallback;
    }
    return parsed;
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  using lockstep::kBadInputExitCode;
  std::vector<std::string> program = lockstep::ParseToolFlags(
      argc, argv,
      "launch [FLAGS] -- PROGRAM [ARGS...]: starts one node's processes of PROGRAM with the "
      "torchrun environment, output prefixed by rank");
  auto bad = [](const std::string& message) {
    std::cerr << "launch: " << message << "\n";
    return kBadInputExitCode;
  };
  const int nproc = absl::GetFlag(FLAGS_nproc), per_node = absl::GetFlag(FLAGS_nproc_per_node);
  if (nproc != -1 && per_node != -1 && nproc != per_node) {
    return bad(
        absl::StrCat("--nproc ", nproc, " and --nproc_per_node ", per_node, " disagree; give one"));
  }
  std::string error;
  lockstep::launch::LaunchOptions options;
  options.nproc = IntSetting(nproc != -1 ? nproc : per_node, -1, {"PET_NPROC_PER_NODE"}, 1, error);
  options.nnodes = IntSetting(absl::GetFlag(FLAGS_nnodes), -1, {"PET_NNODES"}, 1, error);
  options.node_rank = IntSetting(absl::GetFlag(FLAGS_node_rank), -1, {"PET_NODE_RANK"}, 0, error);
  options.master_port = IntSetting(absl::GetFlag(FLAGS_master_port), -1,
                                   {"PET_MASTER_PORT", "MASTER_PORT"}, 0, error);
  if (!error.empty()) return bad(error);
  options.master_addr = absl::GetFlag(FLAGS_master_addr);
  if (options.master_addr == kFromEnvironment) {
    options.master_addr = FromEnvironment({"PET_MASTER_ADDR", "MASTER_ADDR"}).value_or("127.0.0.1");
  }
  options.grace = absl::Seconds(absl::GetFlag(FLAGS_grace_seconds));
  const int64_t deadline = absl::GetFlag(FLAGS_deadline_seconds);
  if (deadline < 0) {
    return bad(absl::StrCat("--deadline_seconds ", deadline, " must not be negative"));
  }
  options.deadline = deadline == 0 ? absl::InfiniteDuration() : absl::Seconds(deadline);
  options.command = program;
  if (absl::Status s = lockstep::launch::ValidateLaunchOptions(options); !s.ok()) {
    return bad(std::string(s.message()));
  }
  absl::StatusOr<lockstep::launch::LaunchResult> result = lockstep::launch::Launch(options);
  if (!result.ok()) return bad(std::string(result.status().message()));
  std::cout << "[launch] " << result->summary << std::endl;
  return result->exit_code;
}
