#include "replay/protocol.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file_io.h"
#include "base/json.h"
#include "launch/launcher.h"
#include "replay/state_replay.h"

namespace lockstep {
namespace replay {
namespace {

// Runs one launch, its output into OUT/<name>.log. The launch's record for the report.
nlohmann::json RunLaunch(const ProtocolOptions& o, const std::string& name,
                         const std::vector<std::string>& extra, std::ostream& progress) {
  launch::LaunchOptions options;
  options.nproc = o.nproc;
  options.command = o.program;
  options.command.push_back(absl::StrCat("--steps=", o.steps));
  options.command.push_back(absl::StrCat("--capture_dir=", o.out, "/", name, "/captures"));
  for (const std::string& arg : extra) options.command.push_back(arg);
  options.deadline = o.deadline;
  const std::string log = absl::StrCat(o.out, "/", name, ".log");
  nlohmann::json record = {{"name", name}, {"command", options.command}, {"log", log}};
  // Never through a link planted at the log's name (O_NOFOLLOW): the folder is new, but shared.
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    record["error"] = absl::StrCat("cannot write ", log);
    return record;
  }
  options.output_fd = fd;
  progress << "replay: " << name << " ..." << std::flush;
  const absl::Time start = absl::Now();
  absl::StatusOr<launch::LaunchResult> result = launch::Launch(options);
  ::close(fd);
  record["seconds"] = absl::ToDoubleSeconds(absl::Now() - start);
  if (!result.ok()) {
    record["error"] = std::string(result.status().message());
  } else {
    record["exit_code"] = result->exit_code;
    record["summary"] = result->summary;
    if (result->exit_code != 0) {
      record["error"] = absl::StrCat(result->summary, " (see ", log, ")");
    }
  }
  progress << (record.contains("error") ? " failed: " + record["error"].get<std::string>()
                                        : std::string(" done"))
           << std::endl;
  return record;
}

// One comparison against the reference: its record, and whether it was decided.
nlohmann::json Compare(const ProtocolOptions& o, const std::string& name, int64_t first_step,
                       bool expect_difference) {
  nlohmann::json record = {{"name", name},
                           {"against", "reference"},
                           {"steps", {first_step, o.steps}},
                           {"expected", expect_difference ? "differ" : "match"}};
  absl::StatusOr<RunComparison> c =
      CompareRuns(absl::StrCat(o.out, "/reference/captures"),
                  absl::StrCat(o.out, "/", name, "/captures"), first_step, o.steps, o.nproc);
  if (!c.ok()) {
    record["verdict"] = "evidence";
    record["error"] = std::string(c.status().message());
    return record;
  }
  record["captures_compared"] = c->captures;
  const bool differs = c->first.has_value();
  if (differs) record["first_difference"] = CaptureDifferenceJson(*c->first);
  record["verdict"] = differs == expect_difference ? "as_expected" : "mismatch";
  return record;
}

std::string Describe(const nlohmann::json& comparison) {
  std::string line = absl::StrCat(comparison["name"].get<std::string>(), " vs reference: ");
  if (comparison["verdict"] == "evidence") {
    return line + "no verdict: " + comparison["error"].get<std::string>();
  }
  if (!comparison.contains("first_difference")) {
    absl::StrAppend(&line, "match (", comparison["captures_compared"].get<int64_t>(),
                    " captures, byte for byte)");
  } else {
    const nlohmann::json& d = comparison["first_difference"];
    absl::StrAppend(&line, "differ first at step ", d["step"].get<int64_t>(), " rank ",
                    d["rank"].get<int>(), " path ", d["path"].get<std::string>());
    if (d["kind"] == "bytes") {
      absl::StrAppend(&line, " byte ", d["byte_offset"].get<int64_t>(), " element ",
                      d["element_index"].get<int64_t>(), " (", d["a"].get<std::string>(), " vs ",
                      d["b"].get<std::string>(), "; ", d["differing_elements"].get<int64_t>(),
                      " of ", d["elements"].get<int64_t>(), " elements differ)");
    } else {
      absl::StrAppend(&line, " (", d["kind"].get<std::string>(), ")");
    }
  }
  if (comparison["verdict"] == "mismatch") {
    absl::StrAppend(&line, comparison["expected"] == "match"
                               ? "  MISMATCH: expected to match"
                               : "  MISMATCH: the omitted restore went unseen");
  }
  return line;
}

const char* VerdictName(ProtocolVerdict verdict) {
  switch (verdict) {
    case ProtocolVerdict::kPass:
      return "pass";
    case ProtocolVerdict::kMismatch:
      return "mismatch";
    case ProtocolVerdict::kEvidence:
      return "evidence";
  }
  return "evidence";
}

}  // namespace

int ProtocolExitCode(ProtocolVerdict verdict) {
  switch (verdict) {
    case ProtocolVerdict::kPass:
      return 0;
    case ProtocolVerdict::kMismatch:
      return 1;
    case ProtocolVerdict::kEvidence:
      return 2;
  }
  return 2;
}

absl::Status PrepareProtocol(const ProtocolOptions& o) {
  if (o.out.empty()) return absl::InvalidArgumentError("--out is required");
  if (o.nproc < 1 || o.nproc > launch::kMaxLocalProcesses) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nproc ", o.nproc, " is outside [1, ", launch::kMaxLocalProcesses, "]"));
  }
  if (o.steps < 2) return absl::InvalidArgumentError(absl::StrCat("--steps ", o.steps, " < 2"));
  if (o.resume_step < 1 || o.resume_step >= o.steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--resume_step ", o.resume_step, " is outside [1, --steps - 1 = ", o.steps - 1, "]"));
  }
  for (const std::string& kind : o.broken) {
    if (kind != "rng" && kind != "optimizer" && kind != "data") {
      return absl::InvalidArgumentError(
          absl::StrCat("--broken '", kind, "' is none of rng, optimizer, data"));
    }
  }
  if (o.deadline < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--deadline_seconds must be at least 1");
  }
  std::error_code error;
  if (o.compare_only) {
    if (!std::filesystem::is_directory(o.out, error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--compare_only: --out ", o.out, " is not a replay's directory"));
    }
    // The report is found writable before the captures are compared, not after.
    return CheckWritable(absl::StrCat(o.out, "/report.json"));
  }
  if (o.program.empty()) return absl::InvalidArgumentError("no program to replay");
  if (std::filesystem::exists(o.out, error) && !std::filesystem::is_empty(o.out, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out ", o.out, " is not empty: earlier captures would mix with new ones"));
  }
  std::filesystem::create_directories(o.out, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("creating --out ", o.out, ": ", error.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ProtocolResult> RunProtocol(const ProtocolOptions& o, std::ostream& progress) {
  const std::string saved = absl::StrCat(o.out, "/reference/saved");
  const std::string resume = absl::StrCat("--resume=", saved, "/step", o.resume_step);
  nlohmann::json launches = nlohmann::json::array();
  if (!o.compare_only) {
    launches.push_back(RunLaunch(
        o, "reference",
        {absl::StrCat("--save_every=", o.resume_step), absl::StrCat("--save_dir=", saved)},
        progress));
    launches.push_back(RunLaunch(o, "independent", {}, progress));
    launches.push_back(RunLaunch(o, "resumed", {resume}, progress));
    for (const std::string& kind : o.broken) {
      launches.push_back(
          RunLaunch(o, "broken-" + kind, {resume, absl::StrCat("--resume_omit=", kind)}, progress));
    }
  }
  nlohmann::json comparisons = nlohmann::json::array();
  comparisons.push_back(Compare(o, "independent", 1, false));
  comparisons.push_back(Compare(o, "resumed", o.resume_step + 1, false));
  for (const std::string& kind : o.broken) {
    comparisons.push_back(Compare(o, "broken-" + kind, o.resume_step + 1, true));
  }
  bool evidence_missing = false, mismatch = false;
  for (const nlohmann::json& l : launches) evidence_missing |= l.contains("error");
  for (const nlohmann::json& c : comparisons) {
    evidence_missing |= c["verdict"] == "evidence";
    mismatch |= c["verdict"] == "mismatch";
    progress << "replay: " << Describe(c) << std::endl;
  }
  ProtocolResult result;
  result.verdict = evidence_missing ? ProtocolVerdict::kEvidence
                   : mismatch       ? ProtocolVerdict::kMismatch
                                    : ProtocolVerdict::kPass;
  result.report = {{"format", "lockstep.replay_report/1"},
                   {"program", o.program},
                   {"nproc", o.nproc},
                   {"steps", o.steps},
                   {"resume_step", o.resume_step},
                   {"launches", launches},
                   {"comparisons", comparisons},
                   {"verdict", VerdictName(result.verdict)},
                   {"exit_code", ProtocolExitCode(result.verdict)}};
  result.report_path = absl::StrCat(o.out, "/report.json");
  if (absl::Status s = WriteFileAtomically(result.report_path, DumpJson(result.report, 2) + "\n");
      !s.ok()) {
    return s;
  }
  return result;
}

}  // namespace replay
}  // namespace lockstep
