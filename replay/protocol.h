// replay/protocol.h
//
// The state-replay protocol over a training program: four kinds of launch, each of `nproc`
// local ranks,
//   reference     uninterrupted, `steps` steps, capturing every rank's state after every step
//                 and saving its resume state at `resume_step`
//   independent   the same, in a fresh process, from the same seeds
//   resumed       a fresh process resumed from the reference's saved state at `resume_step`
//   broken-<kind> a resume that deliberately omits one restore (`broken`: rng, optimizer, data)
// then every declared rank's captures compared byte for byte against the reference's (steps
// 1..N for the independent run, resume_step+1..N for the resumes; state_replay.h), and
// OUT/report.json written naming, per comparison, the first differing step, rank, state path,
// byte offset and element index. tools/replay is its command line.
//
// The program is any program that uses the capture API (state_capture.h) and takes, after its
// own arguments:
//   --steps=N --capture_dir=DIR          train N steps, capturing into DIR
//   --save_every=K --save_dir=DIR        save its resume state at step K into DIR/step<K>
//   --resume=DIR/step<K>                 continue from that saved state
//   --resume_omit=rng|optimizer|data     ... without restoring that part of it
//
// Thread-safety: RunProtocol launches processes and installs the launcher's signal handlers for
// its duration (launch/launcher.h): one at a time per process.
//
// Example:
//   ProtocolOptions options;
//   options.out = "/tmp/replay";
//   options.program = {"bazel-bin/examples/lm/train", "--cp=2"};
//   LOCKSTEP_RETURN_IF_ERROR(PrepareProtocol(options));
//   LOCKSTEP_ASSIGN_OR_RETURN(ProtocolResult result, RunProtocol(options, std::cout));
//   if (result.verdict != ProtocolVerdict::kPass) ...

#ifndef LOCKSTEP_REPLAY_PROTOCOL_H_
#define LOCKSTEP_REPLAY_PROTOCOL_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace lockstep {
namespace replay {

// What RunProtocol runs and compares (see the top of this file); PrepareProtocol checks it.
struct ProtocolOptions {
  // The directory for the launches' captures, logs and report.json. Required.
  std::string out;
  // Ranks of each launch (the program's world size). Default: 4.
  int nproc = 4;
  // Steps of each launch, at least 2. Default: 6.
  int steps = 6;
  // The step the resumes continue from, in [1, steps - 1]. Default: 3.
  int resume_step = 3;
  // The broken resumes, each of "rng", "optimizer", "data". Default: rng.
  std::vector<std::string> broken = {"rng"};
  // The program and its own arguments. Required unless compare_only.
  std::vector<std::string> program;
  // Each launch's limit. Default: 10 minutes.
  absl::Duration deadline = absl::Minutes(10);
  // Launch nothing: compare the captures an earlier replay left in `out` again. Default: off.
  bool compare_only = false;
};

// Checks `options` (kInvalidArgument naming the value and its limit) and prepares `out`: for a
// new replay it must not exist or be empty (earlier captures would mix with new ones) and is
// created; for compare_only it must be a directory.
absl::Status PrepareProtocol(const ProtocolOptions& options);

// What the evidence of a replay says, in report.json and as tools/replay's exit status.
enum class ProtocolVerdict {
  // The independent and resumed runs match the reference and every broken resume differs.
  kPass,
  // A normal run differs, or a broken resume matches (the comparison could not see the omitted
  // restore).
  kMismatch,
  // Evidence missing, partial or incompatible: a launch that failed, a rank whose capture did
  // not complete, a damaged capture, captures from another build or setting.
  kEvidence,
};

// The exit status tools/replay gives a verdict, also recorded in the report: 0, 1, 2.
int ProtocolExitCode(ProtocolVerdict verdict);

// What RunProtocol found: its verdict and the report it wrote.
struct ProtocolResult {
  // The verdict over every comparison. Default: kEvidence.
  ProtocolVerdict verdict = ProtocolVerdict::kEvidence;
  // What OUT/report.json holds (format lockstep.replay_report/1).
  nlohmann::json report;
  // Where the report was written: OUT/report.json.
  std::string report_path;
};

// Runs the launches (none with compare_only) and the comparisons, writing one progress line per
// launch and per comparison to `progress`, and OUT/report.json. An error only when the report
// cannot be written; everything the evidence says is in the result.
// Precondition: PrepareProtocol(options) returned OK.
absl::StatusOr<ProtocolResult> RunProtocol(const ProtocolOptions& options, std::ostream& progress);

}  // namespace replay
}  // namespace lockstep

#endif  // LOCKSTEP_REPLAY_PROTOCOL_H_
