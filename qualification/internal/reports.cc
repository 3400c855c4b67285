#include "qualification/internal/reports.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/file_io.h"
#include "base/json.h"
#include "base/logging.h"
#include "numerics/execution_context.h"

namespace lockstep {
namespace qualification {
namespace internal {

using nlohmann::json;

namespace {

// The largest report a rank writes: its checks' details and evidence, far below this.
constexpr size_t kMaxReportBytes = size_t{64} << 20;

}  // namespace

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

CollectedChecks CollectChecks(const std::vector<json>& reports, std::vector<std::string> errors) {
  CollectedChecks c;
  c.errors = std::move(errors);
  for (int r = 0; r < static_cast<int>(reports.size()); ++r) {
    const json& report = reports[r];
    c.hosts.push_back(report.value("host", "?"));
    if (report.empty()) continue;
    if (r == 0 && report.contains("transport") && report["transport"].is_string()) {
      c.transport = report["transport"].get<std::string>();
    }
    if (report.contains("error") && report["error"].is_string()) {
      c.errors.push_back(absl::StrCat("rank ", r, ": ", report["error"].get<std::string>()));
    }
    for (const json& check : report.value("checks", json::array())) {
      if (!check.is_object() || !check.contains("name") || !check["name"].is_string()) continue;
      const std::string name = check["name"];
      if (!c.per_check.count(name)) c.order.push_back(name);
      json entry = check;
      entry["rank"] = r;
      c.per_check[name].push_back(entry);
    }
  }
  return c;
}

}  // namespace internal

std::vector<std::string> ExpectedChecks(const QualifyOptions& options) {
  std::vector<std::string> names = {
      "replica_agreement",    "dp_workers_independent", "model_stream",    "exception_restoration",
      "partition_invariance", "checkpoint_recompute",   "oom_recovery",    "replica_outputs",
      "caller_draws",         "stream_progression",     "reference_match", "resume"};
  if (options.cp > 1) names.push_back("empty_cp_shard");
  for (const char* name : {"repeatability", "actors", "packing_invariance"}) {
    names.push_back(name);
  }
  return names;
}

namespace internal {

json TableAndEvidence(const QualifyOptions& options, const CollectedChecks& checks,
                      const launch::LaunchResult& launched, const std::string& log_path,
                      std::ostream& out) {
  const int world = options.dp * options.tp * options.cp;
  const std::string topology =
      absl::StrCat("DP", options.dp, " x TP", options.tp, " x CP", options.cp);
  out << "transport: " << checks.transport << "\n\n"
      << absl::StrFormat("%-24s %-6s %-7s %s\n", "check", "result", "ranks", "detail (rank 0)");
  bool all_passed = checks.errors.empty() && launched.exit_code == 0 && !checks.order.empty();
  json evidence;
  evidence["topology"] = {{"dp", options.dp},
                          {"tp", options.tp},
                          {"cp", options.cp},
                          {"world", world},
                          {"nnodes", options.nnodes}};
  evidence["hosts"] = checks.hosts;
  evidence["negative_control"] = NegativeControlName(options.control);
  evidence["device"] = options.device;
  evidence["transport"] = checks.transport;
  evidence["context"] = numerics::CaptureExecutionContext(
      {{"topology", topology}, {"negative_control", NegativeControlName(options.control)}});
  // Every expected check in its order (one no rank reported is a failure: a family that stopped
  // reporting must not pass), then any other a rank reported.
  std::vector<std::string> names = ExpectedChecks(options);
  json missing = json::array();
  for (const std::string& name : checks.order) {
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  for (const std::string& name : names) {
    const auto found = checks.per_check.find(name);
    if (found == checks.per_check.end()) {
      all_passed = false;
      missing.push_back(name);
      out << absl::StrFormat("%-24s %-6s %d/%-5d %s\n", name, "FAIL", 0, world,
                             "no rank reported it");
      evidence["checks"].push_back({{"name", name}, {"passed", false}, {"ranks", json::array()}});
      continue;
    }
    const std::vector<json>& entries = found->second;
    int passed = 0;
    for (const json& e : entries) passed += e.value("passed", false) ? 1 : 0;
    const bool ok = passed == world;
    all_passed = all_passed && ok;
    out << absl::StrFormat("%-24s %-6s %d/%-5d %s\n", name, ok ? "PASS" : "FAIL", passed, world,
                           entries[0].value("detail", std::string()));
    evidence["checks"].push_back({{"name", name}, {"passed", ok}, {"ranks", entries}});
  }
  evidence["missing_checks"] = missing;
  for (const std::string& e : checks.errors) out << "error: " << e << "\n";
  if (launched.exit_code != 0) {
    out << "launch: " << launched.summary << " (worker output in " << log_path << ")\n";
  }
  if (!launched.stalled_ranks.empty()) {
    evidence["stalled_ranks"] = launched.stalled_ranks;
  }
  evidence["errors"] = checks.errors;
  evidence["passed"] = all_passed;
  out << "\n" << (all_passed ? "PASS" : "FAIL") << ": " << topology << "\n";
  return evidence;
}

}  // namespace internal
}  // namespace qualification
}  // namespace lockstep
