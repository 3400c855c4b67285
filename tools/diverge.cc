// diverge: the first module and tensor where two recordings (numerics/divergence.h) differ, in
// execution order, with both records' summaries and, where the tensors were kept, the full
// comparison there. Exit 0: no divergence; 1: diverged; 2: bad input.
//
//   diverge A.rec B.rec [--atol --rtol --rel_l2] [--out=divergence.json]

#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file_io.h"
#include "base/json.h"
#include "base/tool_flags.h"
#include "nlohmann/json.hpp"
#include "numerics/divergence.h"
#include "numerics/execution_context.h"

ABSL_FLAG(double, atol, 1e-5, "absolute tolerance of the comparison at the divergence");
ABSL_FLAG(double, rtol, 0.016, "relative tolerance of the comparison at the divergence");
ABSL_FLAG(double, rel_l2, 0.03, "relative L2 limit of the comparison at the divergence");
ABSL_FLAG(lockstep::OutputPath, out, lockstep::OutputPath(),
          "where to write the JSON result (none when not given)");

namespace {

namespace numerics = lockstep::numerics;

int Fail(const absl::Status& status) {
  std::cerr << "diverge: " << status.message() << std::endl;
  return lockstep::kBadInputExitCode;
}

void PrintRecord(const char* label, const numerics::Record& r) {
  std::cout << absl::StrFormat(
      "  %s: %s [%s] digest %s  sum %.9g  mean|x| %.9g  min %.9g  max %.9g  L2 %.9g\n", label,
      r.dtype, absl::StrJoin(r.shape, ", "), numerics::DigestHex128(r.digest), r.summary.sum,
      r.summary.mean_abs, r.summary.min, r.summary.max, r.summary.l2);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args = lockstep::ParseToolFlags(
      argc, argv,
      "diverge A.rec B.rec [--out=FILE]: the first module where two recordings differ. Exit 0 "
      "none, 1 diverged, 2 bad input.");
  if (args.size() != 2) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("expected two recordings, got ", args.size(), " arguments")));
  }
  const numerics::Tolerance tolerance = numerics::Tolerance()
                                            .set_atol(absl::GetFlag(FLAGS_atol))
                                            .set_rtol(absl::GetFlag(FLAGS_rtol))
                                            .set_relative_l2(absl::GetFlag(FLAGS_rel_l2));
  if (absl::Status s = tolerance.Validate(); !s.ok()) return Fail(s);
  std::vector<numerics::Recording> recordings;
  for (const std::string& path : args) {
    absl::StatusOr<numerics::Recording> r = numerics::Recording::Load(path);
    if (!r.ok()) return Fail(r.status());
    recordings.push_back(std::move(*r));
  }
  absl::StatusOr<std::optional<numerics::Divergence>> found =
      numerics::FirstDivergence(recordings[0], recordings[1], tolerance);
  if (!found.ok()) return Fail(found.status());
  const std::optional<numerics::Divergence>& d = *found;
  if (!d) {
    std::cout << "no divergence: " << recordings[0].records().size()
              << " records, identical digests in execution order\n";
  } else {
    std::cout << "first divergence at record " << d->index << ": module " << d->module << ", "
              << numerics::RecordKindName(d->kind) << " (" << d->reason << ")\n";
    if (d->a) PrintRecord("A", *d->a);
    if (d->b) PrintRecord("B", *d->b);
    if (d->comparison) std::cout << "  " << d->comparison->Summary() << "\n";
  }
  nlohmann::json evidence = {
      {"tool", "diverge"},
      {"inputs", args},
      {"records", {recordings[0].records().size(), recordings[1].records().size()}},
      {"divergence", numerics::DivergenceJson(d)},
      {"context", numerics::CaptureExecutionContext()}};
  if (const std::string out = absl::GetFlag(FLAGS_out).path; !out.empty()) {
    if (absl::Status s = lockstep::WriteFileAtomically(out, lockstep::DumpJson(evidence, 2) + "\n");
        !s.ok()) {
      return Fail(s);
    }
  }
  return d ? 1 : 0;
}
