// qualify --report: the evidence rendered by report/report.py, which is embedded here so
// that the qualify binary needs no runfiles to find it.

#include <signal.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

absl::Status WriteReport(const nlohmann::json& evidence, const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot create '", dir, "': ", error.message()));
  }
  const std::string evidence_path = dir + "/evidence.json";
  const std::string script_path = dir + "/.report.py";
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomically(evidence_path, DumpJson(evidence, 1)));
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomically(script_path, kReportScript));
  absl::StatusOr<Child> started = Child::Exec(
      ChildOptions::Output(), {"/usr/bin/python3", script_path, evidence_path, dir}, {});
  if (!started.ok()) {
    std::filesystem::remove(script_path, error);
    return started.status();
  }
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
  std::filesystem::remove(script_path, error);
  if (!polled.ok()) return polled;
  if (stalled) {
    return absl::DeadlineExceededError(
        absl::StrCat("report/report.py did not finish within 2 minutes: ", output));
  }
  if (!child.succeeded()) {
    return absl::InternalError(absl::StrCat("report/report.py ", child.Describe(), ": ", output));
  }
  return absl::OkStatus();
}

}  // namespace qualification
}  // namespace lockstep
