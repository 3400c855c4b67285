// qualify --report: the evidence rendered by tools/report/report.py, which is embedded here so
// that the qualify binary needs no runfiles to find it.

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file_io.h"
#include "base/status_macros.h"
#include "base/subprocess.h"
#include "tools/qualification.h"

namespace lockstep {
namespace qualification {
namespace {

constexpr char kReportScript[] =
#include "tools/report/report_script.inc"
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
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomically(evidence_path, evidence.dump(1)));
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomically(script_path, kReportScript));
  LOCKSTEP_ASSIGN_OR_RETURN(Child child,
                            Child::Exec(ChildOptions::Output(),
                                        {"/usr/bin/python3", script_path, evidence_path, dir}, {}));
  std::string output;
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(
        int open, PollChannels({&child}, absl::Minutes(2), [&](size_t, absl::string_view bytes) {
          output.append(bytes.data(), bytes.size());
        }));
    if (open == 0) break;
  }
  child.Reap();
  std::filesystem::remove(script_path, error);
  if (!child.succeeded()) {
    return absl::InternalError(
        absl::StrCat("tools/report/report.py ", child.Describe(), ": ", output));
  }
  return absl::OkStatus();
}

}  // namespace qualification
}  // namespace lockstep
