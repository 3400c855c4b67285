// replay: the state-replay protocol over a training program. Four kinds of launch, each of
// --nproc local ranks:
//   reference     uninterrupted, --steps steps, capturing every rank's state after every step
//                 and saving its resume state at --resume_step
//   independent   the same, in a fresh process, from the same seeds
//   resumed       a fresh process resumed from the reference's saved state at --resume_step
//   broken-<kind> a resume that deliberately omits one restore (--broken: rng by default,
//                 optimizer, data; several kinds comma-separated)
// then every declared rank's captures compared byte for byte against the reference's (steps
// 1..N for the independent run, resume_step+1..N for the resumes; trainer/state_replay.h), and
// OUT/report.json written naming, per comparison, the first differing step, rank, state path,
// byte offset and element index.
//
//   replay --out=DIR [--nproc=4 --steps=6 --resume_step=3 --broken=rng] [-- PROGRAM ARGS...]
//   replay --out=DIR --compare_only [same flags]     compare an earlier replay's captures again
//
// Exit 0 only when the independent and resumed runs match the reference and every broken resume
// differs from it; 1 for a mismatch (a normal run differs, or a broken resume matches: the
// comparison could not see the omitted restore); 2 for missing, partial or incompatible evidence
// (a launch that failed, a rank whose capture did not complete, a damaged capture, captures from
// another build or setting) and for bad usage.
//
// The program (default: the example, examples/lm/train, beside this tool in bazel-bin) is any
// program that uses the capture API (trainer/state_capture.h) and takes, after its own ARGS:
//   --steps=N --capture_dir=DIR          train N steps, capturing into DIR
//   --save_every=K --save_dir=DIR        save its resume state at step K into DIR/step<K>
//   --resume=DIR/step<K>                 continue from that saved state
//   --resume_omit=rng|optimizer|data     ... without restoring that part of it

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "base/file_io.h"
#include "base/json.h"
#include "base/tool_flags.h"
#include "nlohmann/json.hpp"
#include "tools/launcher.h"
#include "trainer/state_replay.h"

ABSL_FLAG(std::string, out, "",
          "the directory for the launches' captures, logs and report.json "
          "(created; must not exist or be empty)");
ABSL_FLAG(int, nproc, 4, "ranks of each launch (the program's world size)");
ABSL_FLAG(int, steps, 6, "steps of each launch");
ABSL_FLAG(int, resume_step, 3, "the step the resumes continue from (1..steps-1)");
ABSL_FLAG(std::string, broken, "rng",
          "the broken resumes, comma-separated: rng, optimizer, data (\"\": none)");
ABSL_FLAG(int, deadline_seconds, 600, "each launch's limit");
ABSL_FLAG(bool, compare_only, false,
          "launch nothing: compare the captures an earlier replay left in --out again");

namespace lockstep {
namespace tools {
namespace {

constexpr int kMismatchExitCode = 1;

struct Usage {
  std::string out;
  int nproc, steps, resume_step;
  std::vector<std::string> broken;
  std::vector<std::string> program;
};

// The example beside this tool: bazel-bin/tools/replay -> bazel-bin/examples/lm/train.
std::string DefaultProgram() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return "";
  const std::filesystem::path train = self.parent_path().parent_path() / "examples/lm/train";
  return std::filesystem::exists(train, error) ? train.string() : "";
}

absl::StatusOr<Usage> ParseUsage(std::vector<std::string> program) {
  Usage u{absl::GetFlag(FLAGS_out),
          absl::GetFlag(FLAGS_nproc),
          absl::GetFlag(FLAGS_steps),
          absl::GetFlag(FLAGS_resume_step),
          {},
          std::move(program)};
  if (u.out.empty()) return absl::InvalidArgumentError("--out is required");
  if (u.nproc < 1 || u.nproc > kMaxLocalProcesses) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nproc ", u.nproc, " is outside [1, ", kMaxLocalProcesses, "]"));
  }
  if (u.steps < 2) return absl::InvalidArgumentError(absl::StrCat("--steps ", u.steps, " < 2"));
  if (u.resume_step < 1 || u.resume_step >= u.steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--resume_step ", u.resume_step, " is outside [1, --steps - 1 = ", u.steps - 1, "]"));
  }
  for (absl::string_view kind :
       absl::StrSplit(absl::GetFlag(FLAGS_broken), ',', absl::SkipEmpty())) {
    if (kind != "rng" && kind != "optimizer" && kind != "data") {
      return absl::InvalidArgumentError(
          absl::StrCat("--broken '", kind, "' is none of rng, optimizer, data"));
    }
    u.broken.emplace_back(kind);
  }
  if (absl::GetFlag(FLAGS_deadline_seconds) < 1) {
    return absl::InvalidArgumentError("--deadline_seconds must be at least 1");
  }
  std::error_code error;
  if (absl::GetFlag(FLAGS_compare_only)) {
    if (!std::filesystem::is_directory(u.out, error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--compare_only: --out ", u.out, " is not a replay's directory"));
    }
    return u;
  }
  if (u.program.empty()) {
    const std::string program = DefaultProgram();
    if (program.empty()) {
      return absl::InvalidArgumentError(
          "no program after -- and no examples/lm/train beside this tool");
    }
    u.program = {program};
  }
  if (std::filesystem::exists(u.out, error) && !std::filesystem::is_empty(u.out, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out ", u.out, " is not empty: earlier captures would mix with new ones"));
  }
  std::filesystem::create_directories(u.out, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("creating --out ", u.out, ": ", error.message()));
  }
  return u;
}

// Runs one launch, its output into OUT/<name>.log. The launch's record for the report.
nlohmann::json RunLaunch(const Usage& u, const std::string& name,
                         const std::vector<std::string>& extra) {
  LaunchOptions options;
  options.nproc = u.nproc;
  options.command = u.program;
  options.command.push_back(absl::StrCat("--steps=", u.steps));
  options.command.push_back(absl::StrCat("--capture_dir=", u.out, "/", name, "/captures"));
  for (const std::string& arg : extra) options.command.push_back(arg);
  options.deadline = absl::Seconds(absl::GetFlag(FLAGS_deadline_seconds));
  const std::string log = absl::StrCat(u.out, "/", name, ".log");
  nlohmann::json record = {{"name", name}, {"command", options.command}, {"log", log}};
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    record["error"] = absl::StrCat("cannot write ", log);
    return record;
  }
  options.output_fd = fd;
  std::cout << "replay: " << name << " ..." << std::flush;
  const absl::Time start = absl::Now();
  absl::StatusOr<LaunchResult> result = Launch(options);
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
  std::cout << (record.contains("error") ? " failed: " + record["error"].get<std::string>()
                                         : std::string(" done"))
            << std::endl;
  return record;
}

// One comparison against the reference: its record, and whether it was decided.
nlohmann::json Compare(const Usage& u, const std::string& name, int64_t first_step,
                       bool expect_difference) {
  nlohmann::json record = {{"name", name},
                           {"against", "reference"},
                           {"steps", {first_step, u.steps}},
                           {"expected", expect_difference ? "differ" : "match"}};
  absl::StatusOr<trainer::RunComparison> c = trainer::CompareRuns(
      absl::StrCat(u.out, "/reference/captures"), absl::StrCat(u.out, "/", name, "/captures"),
      first_step, u.steps, u.nproc);
  if (!c.ok()) {
    record["verdict"] = "evidence";
    record["error"] = std::string(c.status().message());
    return record;
  }
  record["captures_compared"] = c->captures;
  const bool differs = c->first.has_value();
  if (differs) record["first_difference"] = trainer::CaptureDifferenceJson(*c->first);
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

int Replay(const Usage& u) {
  const std::string saved = absl::StrCat(u.out, "/reference/saved");
  const std::string resume = absl::StrCat("--resume=", saved, "/step", u.resume_step);
  nlohmann::json launches = nlohmann::json::array();
  if (!absl::GetFlag(FLAGS_compare_only)) {
    launches.push_back(RunLaunch(
        u, "reference",
        {absl::StrCat("--save_every=", u.resume_step), absl::StrCat("--save_dir=", saved)}));
    launches.push_back(RunLaunch(u, "independent", {}));
    launches.push_back(RunLaunch(u, "resumed", {resume}));
    for (const std::string& kind : u.broken) {
      launches.push_back(
          RunLaunch(u, "broken-" + kind, {resume, absl::StrCat("--resume_omit=", kind)}));
    }
  }
  nlohmann::json comparisons = nlohmann::json::array();
  comparisons.push_back(Compare(u, "independent", 1, false));
  comparisons.push_back(Compare(u, "resumed", u.resume_step + 1, false));
  for (const std::string& kind : u.broken) {
    comparisons.push_back(Compare(u, "broken-" + kind, u.resume_step + 1, true));
  }
  bool evidence_missing = false, mismatch = false;
  for (const nlohmann::json& l : launches) evidence_missing |= l.contains("error");
  for (const nlohmann::json& c : comparisons) {
    evidence_missing |= c["verdict"] == "evidence";
    mismatch |= c["verdict"] == "mismatch";
    std::cout << "replay: " << Describe(c) << std::endl;
  }
  const int exit_code = evidence_missing ? kBadInputExitCode : (mismatch ? kMismatchExitCode : 0);
  const nlohmann::json report = {
      {"format", "lockstep.replay_report/1"},
      {"program", u.program},
      {"nproc", u.nproc},
      {"steps", u.steps},
      {"resume_step", u.resume_step},
      {"launches", launches},
      {"comparisons", comparisons},
      {"verdict", evidence_missing ? "evidence" : (mismatch ? "mismatch" : "pass")},
      {"exit_code", exit_code}};
  const std::string path = absl::StrCat(u.out, "/report.json");
  if (absl::Status s = WriteFileAtomically(path, DumpJson(report, 2) + "\n"); !s.ok()) {
    std::cerr << "replay: " << s.message() << std::endl;
    return kBadInputExitCode;
  }
  std::cout << "replay: "
            << (exit_code == 0     ? "PASS: the normal runs match and every broken resume is seen"
                : evidence_missing ? "NO VERDICT: evidence missing or refused"
                                   : "FAIL: mismatch")
            << " (" << path << ")" << std::endl;
  return exit_code;
}

}  // namespace
}  // namespace tools
}  // namespace lockstep

int main(int argc, char** argv) {
  std::vector<std::string> program = lockstep::ParseToolFlags(
      argc, argv,
      "replay --out=DIR [FLAGS] [-- PROGRAM ARGS...]: the state-replay protocol (reference, "
      "independent, resumed and broken-resume launches compared byte for byte)");
  absl::StatusOr<lockstep::tools::Usage> usage = lockstep::tools::ParseUsage(std::move(program));
  if (!usage.ok()) {
    std::cerr << "replay: " << usage.status().message() << std::endl;
    return lockstep::kBadInputExitCode;
  }
  return lockstep::tools::Replay(*usage);
}
