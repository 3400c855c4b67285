// compare: strict comparison of two safetensors files under a declared tolerance
// (numerics/compare.h). Prints a table, worst tensors first, and writes JSON evidence with the
// tolerance, both files' state digests, every per-tensor figure, this run's execution context
// and, when both files carry one, which context fields differ between them.
// Exit 0: every tensor passed; 1: some failed (or a name is in only one file); 2: bad input.
//
//   compare ACTUAL.safetensors EXPECTED.safetensors [--atol=X] [--rtol=X] [--rel_l2=X]
//           [--bitwise] [--nan_equal] [--out=result.json]

#include <algorithm>
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
#include "numerics/compare.h"
#include "numerics/execution_context.h"
#include "numerics/inventory.h"
#include "numerics/safetensors.h"

ABSL_FLAG(double, atol, 1e-5, "absolute tolerance: |a - b| <= atol + rtol * |b|");
ABSL_FLAG(double, rtol, 0.016, "relative tolerance, relative to the second (expected) file");
ABSL_FLAG(double, rel_l2, 0.03, "largest ||a - b|| / ||b|| per tensor");
ABSL_FLAG(bool, bitwise, false, "pass only bit-identical tensors");
ABSL_FLAG(bool, nan_equal, false, "NaN equals NaN");
ABSL_FLAG(lockstep::OutputPath, out, lockstep::OutputPath(),
          "where to write the JSON result (none when not given)");

namespace {

using lockstep::kBadInputExitCode;
namespace numerics = lockstep::numerics;

int Fail(const absl::Status& status) {
  std::cerr << "compare: " << status.message() << std::endl;
  return kBadInputExitCode;
}

std::string Figure(double v) { return absl::StrFormat("%.3g", v); }

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args = lockstep::ParseToolFlags(
      argc, argv,
      "compare ACTUAL EXPECTED [--atol --rtol --rel_l2 --bitwise --nan_equal --out]: compares "
      "two safetensors files under a tolerance. Exit 0 pass, 1 fail, 2 bad input.");
  if (args.size() != 2) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("expected two safetensors files, got ", args.size(), " arguments")));
  }
  // An output that cannot be written is found before the files are read, not after.
  if (const std::string out = absl::GetFlag(FLAGS_out).path; !out.empty()) {
    if (absl::Status s = lockstep::CheckWritable(out); !s.ok()) return Fail(s);
  }
  numerics::Tolerance tolerance;
  tolerance.atol = absl::GetFlag(FLAGS_atol);
  tolerance.rtol = absl::GetFlag(FLAGS_rtol);
  tolerance.relative_l2 = absl::GetFlag(FLAGS_rel_l2);
  tolerance.bitwise = absl::GetFlag(FLAGS_bitwise);
  tolerance.nan_equal = absl::GetFlag(FLAGS_nan_equal);
  if (absl::Status s = tolerance.Validate(); !s.ok()) return Fail(s);
  std::vector<numerics::SafetensorsFile> files;
  std::vector<numerics::NamedTensors> sets;
  nlohmann::json inputs = nlohmann::json::array();
  for (const std::string& path : args) {
    absl::StatusOr<numerics::SafetensorsFile> file = numerics::SafetensorsFile::Open(path);
    if (!file.ok()) return Fail(file.status());
    absl::StatusOr<numerics::Inventory> inventory = numerics::Inventory::OfFile(*file);
    if (!inventory.ok()) return Fail(inventory.status());
    absl::StatusOr<numerics::NamedTensors> tensors = file->Tensors();
    if (!tensors.ok()) return Fail(tensors.status());
    inputs.push_back({{"path", path},
                      {"state_digest", numerics::DigestHex128(inventory->state_digest())},
                      {"tensors", inventory->entries().size()}});
    sets.push_back(std::move(*tensors));
    files.push_back(std::move(*file));
  }
  absl::StatusOr<numerics::SetComparison> result =
      numerics::CompareTensorSets(sets[0], sets[1], tolerance);
  if (!result.ok()) return Fail(result.status());

  // The table: failures first, then by tolerance ratio, worst first.
  std::vector<const numerics::TensorComparison*> rows;
  for (const auto& t : result->tensors) rows.push_back(&t);
  std::stable_sort(rows.begin(), rows.end(), [](auto* a, auto* b) {
    if (a->passed != b->passed) return !a->passed;
    return a->max_tolerance_ratio > b->max_tolerance_ratio;
  });
  std::cout << absl::StrFormat("%-32s %-6s %-15s %-10s %-10s %-10s %s\n", "tensor", "result",
                               "over/elements", "max|a-b|", "max ratio", "rel L2", "first at");
  for (const auto* t : rows) {
    if (t->outcome != numerics::TensorComparison::Outcome::kCompared) {
      std::cout << absl::StrFormat("%-32s %-6s %s\n", t->name, "FAIL",
                                   numerics::OutcomeName(t->outcome) + ": " + t->detail);
      continue;
    }
    std::cout << absl::StrFormat(
        "%-32s %-6s %-15s %-10s %-10s %-10s %s\n", t->name, t->passed ? "PASS" : "FAIL",
        absl::StrCat(t->over_tolerance, "/", t->elements), Figure(t->max_abs_diff),
        Figure(t->max_tolerance_ratio), Figure(t->relative_l2),
        t->first_offending_index.empty()
            ? "-"
            : absl::StrCat("[", absl::StrJoin(t->first_offending_index, ", "), "]"));
  }
  nlohmann::json evidence = {{"tool", "compare"},
                             {"inputs", inputs},
                             {"comparison", numerics::SetComparisonJson(*result)},
                             {"context", numerics::CaptureExecutionContext()}};
  const auto a_context = numerics::ContextFromMetadata(files[0].metadata());
  const auto b_context = numerics::ContextFromMetadata(files[1].metadata());
  if (a_context && b_context) {
    const std::vector<std::string> differ = numerics::ContextDifferences(*a_context, *b_context);
    evidence["input_context_differences"] = differ;
    std::cout << "execution contexts of the inputs: "
              << (differ.empty() ? "identical" : "differ in " + absl::StrJoin(differ, ", "))
              << "\n";
  }
  std::cout << "\n"
            << (result->all_passed() ? "PASS" : "FAIL") << ": " << result->passed << " passed, "
            << result->failed << " failed (state digests "
            << inputs[0]["state_digest"].get<std::string>() << " vs "
            << inputs[1]["state_digest"].get<std::string>() << ")\n";
  if (const std::string out = absl::GetFlag(FLAGS_out).path; !out.empty()) {
    if (absl::Status s = lockstep::WriteFileAtomically(out, lockstep::DumpJson(evidence, 2) + "\n");
        !s.ok()) {
      return Fail(s);
    }
  }
  return result->all_passed() ? 0 : 1;
}
