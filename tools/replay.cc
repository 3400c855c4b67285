// replay: the state-replay protocol (replay/protocol.h) over a training program: reference,
// independent, resumed and broken-resume launches of --nproc local ranks (--broken: rng by
// default, optimizer, data; several kinds comma-separated), their captures compared byte for
// byte, and OUT/report.json naming, per comparison, the first differing step, rank, state path,
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
// program that uses the capture API (replay/state_capture.h) and takes the protocol's flags
// after its own ARGS (replay/protocol.h lists them).

#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "base/tool_flags.h"
#include "replay/protocol.h"

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

namespace {

// The example beside this tool: bazel-bin/tools/replay -> bazel-bin/examples/lm/train.
std::string DefaultProgram() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return "";
  const std::filesystem::path train = self.parent_path().parent_path() / "examples/lm/train";
  return std::filesystem::exists(train, error) ? train.string() : "";
}

}  // namespace

int main(int argc, char** argv) {
  namespace replay = lockstep::replay;
  replay::ProtocolOptions options;
  options.program = lockstep::ParseToolFlags(
      argc, argv,
      "replay --out=DIR [FLAGS] [-- PROGRAM ARGS...]: the state-replay protocol (reference, "
      "independent, resumed and broken-resume launches compared byte for byte)");
  options.out = absl::GetFlag(FLAGS_out);
  options.nproc = absl::GetFlag(FLAGS_nproc);
  options.steps = absl::GetFlag(FLAGS_steps);
  options.resume_step = absl::GetFlag(FLAGS_resume_step);
  options.broken = absl::StrSplit(absl::GetFlag(FLAGS_broken), ',', absl::SkipEmpty());
  options.deadline = absl::Seconds(absl::GetFlag(FLAGS_deadline_seconds));
  options.compare_only = absl::GetFlag(FLAGS_compare_only);
  if (!options.compare_only && options.program.empty()) {
    const std::string program = DefaultProgram();
    if (program.empty()) {
      std::cerr << "replay: no program after -- and no examples/lm/train beside this tool"
                << std::endl;
      return lockstep::kBadInputExitCode;
    }
    options.program = {program};
  }
  if (absl::Status s = replay::PrepareProtocol(options); !s.ok()) {
    std::cerr << "replay: " << s.message() << std::endl;
    return lockstep::kBadInputExitCode;
  }
  absl::StatusOr<replay::ProtocolResult> result = replay::RunProtocol(options, std::cout);
  if (!result.ok()) {
    std::cerr << "replay: " << result.status().message() << std::endl;
    return lockstep::kBadInputExitCode;
  }
  std::cout << "replay: "
            << (result->verdict == replay::ProtocolVerdict::kPass
                    ? "PASS: the normal runs match and every broken resume is seen"
                : result->verdict == replay::ProtocolVerdict::kEvidence
                    ? "NO VERDICT: evidence missing or refused"
                    : "FAIL: mismatch")
            << " (" << result->report_path << ")" << std::endl;
  return replay::ProtocolExitCode(result->verdict);
}
