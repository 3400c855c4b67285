// qualify --report: the evidence rendered by report/report.py, which is embedded here so
// that the qualify binary needs no runfiles to find it.

#include <signal.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/file_io.h"
#include "base/json.h"
#include "base/status_macros.h"
#include "base/subprocess.h"
#include "qualification/qualification.h"

namespace lockstep {
namespace qualification {
namespace {

constexpr char kReportScript[] =
#include "report/report_script.inc"
    ;

}  // namespace

absl::StatusOr<std::string> WriteReport(const nlohmann::json& evidence, const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot create '", dir, "': ", error.message()));
  }
  const std::string evidence_path = dir + "/evidence.json";
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomically(evidence_path, DumpJson(evidence, 1)));
  // The script is given as -c text, never written into `dir` and run from there: a script's
  // folder is first on Python's import path, so a module another user planted in `dir` would run
  // as this user. -I drops the user's site-packages and environment from the path as well.
  absl::StatusOr<Child> started =
      Child::Exec(ChildOptions::Output(),
                  {"/usr/bin/python3", "-I", "-c", kReportScript, evidence_path, dir}, {});
  if (!started.ok()) return std::string(started.status().message());
  Child& child = *started;
  // One limit for the whole run: a script that stalls is killed, not waited for.
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  std::string output;
  absl::Status polled;
  while (absl::Now() < deadline) {
    absl::StatusOr<int> open = PollChannels(
        {&child}, deadline - absl::Now(),
        [&](size_t, absl::string_view bytes) { output.append(bytes.data(), bytes.size()); });
    if (!open.ok()) polled = open.status();
    if (!open.ok() || *open == 0) break;
  }
  const bool stalled = polled.ok() && absl::Now() >= deadline;
  if (stalled || !polled.ok()) child.Signal(SIGKILL);
  child.Reap();
  if (!polled.ok()) return std::string(polled.message());
  if (stalled) return absl::StrCat("report/report.py did not finish within 2 minutes: ", output);
  if (!child.succeeded()) return absl::StrCat("report/report.py ", child.Describe(), ": ", output);
  // A page drawn without its plots (no matplotlib) says so: passed on, less the line that only
  // says where the page is.
  std::string warning;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipWhitespace())) {
    if (!absl::StartsWith(line, "report: "))
      absl::StrAppend(&warning, warning.empty() ? "" : "\n", line);
  }
  return warning;
}

}  // namespace qualification
}  // namespace lockstep
