// diverge: the first module and tensor where two recordings (numerics/divergence.h) differ, in
// execution order, with both records' summaries and, where the tensors were kept, the full
// comparison there. Given two operator recordings (numerics/op_recorder.h), the first operator
// whose inputs matched and whose outputs differ (the nondeterministic one) and, separately, the
// first whose inputs already differed (numerics/op_divergence.h). Exit 0: no divergence; 1:
// diverged; 2: bad input (a recording of each kind, a malformed file).
//
//   diverge A.rec B.rec [--atol --rtol --rel_l2] [--out=divergence.json]
//   diverge A.ops.jsonl B.ops.jsonl [--out=divergence.json]

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
#include "numerics/op_divergence.h"
#include "numerics/op_recording.h"

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

void PrintCall(const char* label, const numerics::OperatorRecord& r) {
  auto values = [](const std::vector<numerics::OperatorValue>& side) {
    std::vector<std::string> parts;
    for (const numerics::OperatorValue& v : side) {
      std::string part = v.kind;
      if (!v.dtype.empty()) absl::StrAppend(&part, " ", v.dtype);
      if (!v.shape.empty() || v.kind == "tensor") {
        absl::StrAppend(&part, " [", absl::StrJoin(numerics::DigestedShape(v), ", "), "]");
      }
      if (v.kind == "scalar") absl::StrAppend(&part, " ", v.value);
      parts.push_back(std::move(part));
    }
    return absl::StrJoin(parts, "; ");
  };
  std::cout << absl::StrFormat("  %s: inputs (%s) digest %s\n     outputs (%s) digest %s\n", label,
                               values(r.inputs), numerics::DigestHex128(r.inputs_digest),
                               values(r.outputs), numerics::DigestHex128(r.outputs_digest));
}

void PrintFinding(const char* what, const std::optional<numerics::OperatorFinding>& f) {
  if (!f) return;
  std::cout << what << ": call " << f->index << ", " << f->op << " in " << f->module << " ("
            << f->reason << ")";
  if (f->inner_index >= 0)
    std::cout << ", innermost " << f->inner_op << " (call " << f->inner_index << ")";
  std::cout << "\n";
  PrintCall("A", f->a);
  PrintCall("B", f->b);
  for (const numerics::OperatorFinding::OutputFigures& o : f->figures) {
    std::cout << absl::StrFormat(
        "  output %d%s: sum %.9g vs %.9g (diff %.3g), max|x| %.9g vs %.9g (diff %.3g)\n", o.arg,
        o.item >= 0 ? absl::StrCat("[", o.item, "]") : "", o.sum_a, o.sum_b, o.sum_diff,
        o.max_abs_a, o.max_abs_b, o.max_abs_diff);
  }
}

absl::Status WriteEvidence(const std::vector<std::string>& args, nlohmann::json evidence) {
  const std::string out = absl::GetFlag(FLAGS_out).path;
  if (out.empty()) return absl::OkStatus();
  evidence["tool"] = "diverge";
  evidence["inputs"] = args;
  evidence["context"] = numerics::CaptureExecutionContext();
  return lockstep::WriteFileAtomically(out, lockstep::DumpJson(evidence, 2) + "\n");
}

// Two operator recordings: the first operator whose outputs differ from matching inputs.
int DivergeOperators(const std::vector<std::string>& args) {
  std::vector<numerics::OperatorRecording> recordings;
  for (const std::string& path : args) {
    absl::StatusOr<numerics::OperatorRecording> r = numerics::OperatorRecording::Load(path);
    if (!r.ok()) return Fail(r.status());
    recordings.push_back(std::move(*r));
  }
  const numerics::OperatorDivergence d =
      numerics::FirstOperatorDivergence(recordings[0], recordings[1]);
  std::cout << numerics::OperatorDivergenceSummary(d) << "\n";
  PrintFinding("first operator whose inputs matched and outputs differ", d.first_outputs_differ);
  PrintFinding("first operator whose inputs differ", d.first_inputs_differ);
  if (absl::Status s = WriteEvidence(args, {{"operators", numerics::OperatorDivergenceJson(d)}});
      !s.ok()) {
    return Fail(s);
  }
  return d.diverged() ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args = lockstep::ParseToolFlags(
      argc, argv,
      "diverge A B [--out=FILE]: the first module (two module recordings) or the first operator "
      "(two operator recordings) where two recordings differ. Exit 0 none, 1 diverged, 2 bad "
      "input.");
  if (args.size() != 2) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("expected two recordings, got ", args.size(), " arguments")));
  }
  // An output that cannot be written (a full device, a link, a missing folder) is found before
  // the recordings are read, not after.
  if (const std::string out = absl::GetFlag(FLAGS_out).path; !out.empty()) {
    if (absl::Status s = lockstep::CheckWritable(out); !s.ok()) return Fail(s);
  }
  const bool operators_a = numerics::OperatorRecording::LooksLikeOne(args[0]);
  const bool operators_b = numerics::OperatorRecording::LooksLikeOne(args[1]);
  if (operators_a != operators_b) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("'", args[operators_a ? 0 : 1], "' is an operator recording and '",
                     args[operators_a ? 1 : 0], "' is not: compare two of the same kind")));
  }
  if (operators_a) return DivergeOperators(args);
  numerics::Tolerance tolerance;
  tolerance.atol = absl::GetFlag(FLAGS_atol);
  tolerance.rtol = absl::GetFlag(FLAGS_rtol);
  tolerance.relative_l2 = absl::GetFlag(FLAGS_rel_l2);
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
  if (absl::Status s = WriteEvidence(
          args, {{"records", {recordings[0].records().size(), recordings[1].records().size()}},
                 {"divergence", numerics::DivergenceJson(d)}});
      !s.ok()) {
    return Fail(s);
  }
  return d ? 1 : 0;
}
