// ledger: verifies recovery ledgers (admission/ledger.h) and says what each holds: per step,
// committed or not, tokens completed of planned, events by kind, and every DP rank's last
// committed step. The check a person (or a multi-host fault test) runs on a surviving rank's
// ledger after a crash: a ledger that is not intact is refused, naming the file and what is wrong.
// Exit 0: every file verified; 1: a file refused (kDataLoss, kNotFound, ...); 2: bad input.
//
//   ledger FILE.db [FILE.db ...] [--out=ledger.json]

#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "admission/ledger.h"
#include "base/file_io.h"
#include "base/json.h"
#include "base/tool_flags.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(lockstep::OutputPath, out, lockstep::OutputPath(),
          "where to write the JSON account of the ledgers (none when not given)");

namespace {

namespace admission = lockstep::admission;

nlohmann::json StepJson(const admission::StepReplay& step) {
  nlohmann::json missing = nlohmann::json::array();
  for (const admission::TokenRange& r : step.missing) {
    missing.push_back({{"batch_index", r.batch_index}, {"begin", r.begin}, {"end", r.end}});
  }
  return {{"step", step.step},
          {"dp_rank", step.dp_rank},
          {"committed", step.committed},
          {"planned_tokens", step.planned_tokens},
          {"completed_tokens", step.completed_tokens},
          {"missing", missing}};
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args = lockstep::ParseToolFlags(
      argc, argv,
      "ledger FILE [FILE ...] [--out=FILE]: verifies recovery ledgers and prints their steps and "
      "each DP rank's last committed step. Exit 0 all verified, 1 a file refused, 2 bad input.");
  if (args.empty()) {
    std::cerr << "ledger: expected one or more ledger files, got none" << std::endl;
    return lockstep::kBadInputExitCode;
  }
  nlohmann::json files = nlohmann::json::array();
  bool all_verified = true;
  for (const std::string& path : args) {
    absl::StatusOr<admission::LedgerReplay> replay = admission::Ledger::Replay(path);
    if (!replay.ok()) {
      all_verified = false;
      std::cout << path << ": REFUSED (" << absl::StatusCodeToString(replay.status().code())
                << "): " << replay.status().message() << "\n";
      files.push_back({{"path", path},
                       {"verified", false},
                       {"code", absl::StatusCodeToString(replay.status().code())},
                       {"error", std::string(replay.status().message())}});
      continue;
    }
    std::set<int> dp_ranks;
    nlohmann::json steps = nlohmann::json::array();
    for (const admission::StepReplay& step : replay->steps) {
      dp_ranks.insert(step.dp_rank);
      steps.push_back(StepJson(step));
    }
    std::cout << path << ": verified, " << replay->steps.size() << " steps, "
              << replay->events.size() << " events\n"
              << replay->Summary();
    nlohmann::json last = nlohmann::json::object();
    for (int dp_rank : dp_ranks) {
      const int64_t step = replay->LastCommittedStep(dp_rank);
      std::cout << "  dp rank " << dp_rank << ": last committed step " << step << "\n";
      last[std::to_string(dp_rank)] = step;
    }
    files.push_back({{"path", path},
                     {"verified", true},
                     {"events", replay->events.size()},
                     {"steps", steps},
                     {"last_committed_step", last}});
  }
  std::cout.flush();
  const lockstep::OutputPath out = absl::GetFlag(FLAGS_out);
  if (!out.path.empty()) {
    const nlohmann::json evidence = {{"tool", "ledger"}, {"files", files}};
    if (absl::Status s =
            lockstep::WriteFileAtomically(out.path, lockstep::DumpJson(evidence, 2) + "\n");
        !s.ok()) {
      std::cerr << "ledger: " << s.message() << std::endl;
      return lockstep::kBadInputExitCode;
    }
  }
  return all_verified ? 0 : 1;
}
