// numerics/op_divergence.cc: the first operator where two recordings differ (op_divergence.h).

#include "numerics/op_divergence.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/json.h"
#include "nlohmann/json.hpp"

namespace lockstep {
namespace numerics {

using json = nlohmann::json;

namespace {

bool SameStructure(const std::vector<OperatorValue>& a, const std::vector<OperatorValue>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const OperatorValue& x = a[i];
    const OperatorValue& y = b[i];
    if (x.arg != y.arg || x.item != y.item || x.kind != y.kind || x.dtype != y.dtype ||
        DigestedShape(x) != DigestedShape(y)) {
      return false;
    }
  }
  return true;
}

// "" when the side matches, else why not.
std::string SideDifference(const std::vector<OperatorValue>& a, const Digest128& da,
                           const std::vector<OperatorValue>& b, const Digest128& db,
                           absl::string_view side) {
  if (!SameStructure(a, b)) return absl::StrCat(side, " structure");
  if (da != db) return absl::StrCat(side, " digest");
  return "";
}

OperatorFinding Finding(const OperatorRecord& a, const OperatorRecord& b, std::string reason) {
  OperatorFinding f;
  f.index = a.index;
  f.op = a.op;
  f.module = a.module;
  f.reason = std::move(reason);
  f.a = a;
  f.b = b;
  for (const OperatorValue& x : a.outputs) {
    if (x.kind != "tensor") continue;
    for (const OperatorValue& y : b.outputs) {
      if (y.kind != "tensor" || y.arg != x.arg || y.item != x.item) continue;
      OperatorFinding::OutputFigures figures;
      figures.arg = x.arg;
      figures.item = x.item;
      figures.sum_a = x.sum;
      figures.sum_b = y.sum;
      figures.sum_diff = y.sum - x.sum;
      figures.max_abs_a = x.max_abs;
      figures.max_abs_b = y.max_abs;
      figures.max_abs_diff = y.max_abs - x.max_abs;
      f.figures.push_back(figures);
    }
  }
  return f;
}

json FindingJson(const std::optional<OperatorFinding>& f) {
  if (!f) return json();
  json figures = json::array();
  for (const OperatorFinding::OutputFigures& o : f->figures) {
    json entry = {{"arg", o.arg},
                  {"sum_a", JsonFigure(o.sum_a)},
                  {"sum_b", JsonFigure(o.sum_b)},
                  {"sum_diff", JsonFigure(o.sum_diff)},
                  {"max_abs_a", JsonFigure(o.max_abs_a)},
                  {"max_abs_b", JsonFigure(o.max_abs_b)},
                  {"max_abs_diff", JsonFigure(o.max_abs_diff)}};
    if (o.item >= 0) entry["item"] = o.item;
    figures.push_back(std::move(entry));
  }
  json j = {{"index", f->index},
            {"op", f->op},
            {"module", f->module},
            {"reason", f->reason},
            {"a", OperatorRecordJson(f->a)},
            {"b", OperatorRecordJson(f->b)},
            {"outputs", std::move(figures)}};
  if (f->inner_index >= 0) j["inner"] = {{"index", f->inner_index}, {"op", f->inner_op}};
  return j;
}

}  // namespace

// Note [Calls inside calls]
// An operator's implementation may allocate its result or scratch space without the dispatcher
// (ATen's structured kernels do) and then pass it, unwritten, to operators of its own (a view
// for a reduction's output: aten::as_strided on garbage). Such a nested call's inputs differ
// between runs without anything having diverged. The walk therefore compares only the calls
// made directly by the program (depth 0 on their thread: its forward and autograd's backward
// formulas); their inputs are complete tensors, outputs of earlier calls or the program's own.
// A nested call is looked at only to descend into a finding (Note [Innermost nondeterministic
// call]), where a garbage input excludes it by not matching.
//
// Note [Innermost nondeterministic call]
// Calls nest: aten::mean runs aten::sum inside it, a custom operator may run ATen operators.
// The finding is the call the program made (aten::index_add_, the one to replace or fix); when a
// call inside it also had matching inputs and differing outputs, the walk descends through such
// calls (its children: same thread, parent chain) and names the innermost as `inner`, the
// computation that produced the different bits.
OperatorDivergence FirstOperatorDivergence(const OperatorRecording& a, const OperatorRecording& b) {
  OperatorDivergence d;
  const auto& ra = a.records();
  const auto& rb = b.records();
  d.calls_a = static_cast<int64_t>(ra.size());
  d.calls_b = static_cast<int64_t>(rb.size());
  const size_t n = std::min(ra.size(), rb.size());
  auto inputs_differ = [&](size_t i) {
    return SideDifference(ra[i].inputs, ra[i].inputs_digest, rb[i].inputs, rb[i].inputs_digest,
                          "inputs");
  };
  auto outputs_differ = [&](size_t i) {
    return SideDifference(ra[i].outputs, ra[i].outputs_digest, rb[i].outputs, rb[i].outputs_digest,
                          "outputs");
  };
  size_t i = 0;
  for (; i < n && !(d.first_inputs_differ && d.first_outputs_differ); ++i) {
    if (ra[i].op != rb[i].op || ra[i].module != rb[i].module || ra[i].parent != rb[i].parent) {
      d.misaligned_at = static_cast<int64_t>(i);
      d.misaligned_reason = "structure";
      break;
    }
    // Note [Calls inside calls]
    if (ra[i].depth > 0) continue;
    const std::string in = inputs_differ(i);
    if (!in.empty()) {
      if (!d.first_inputs_differ) d.first_inputs_differ = Finding(ra[i], rb[i], in);
      continue;
    }
    const std::string out = outputs_differ(i);
    if (out.empty() || d.first_outputs_differ) continue;
    // Note [Innermost nondeterministic call]
    size_t found = i;
    for (bool descended = true; descended;) {
      descended = false;
      for (size_t k = found + 1; k < n && ra[k].depth > ra[found].depth; ++k) {
        if (ra[k].parent != static_cast<int64_t>(found) || ra[k].op != rb[k].op) continue;
        if (inputs_differ(k).empty() && !outputs_differ(k).empty()) {
          found = k;
          descended = true;
          break;
        }
      }
    }
    d.first_outputs_differ = Finding(ra[i], rb[i], out);
    if (found != i) {
      d.first_outputs_differ->inner_index = static_cast<int64_t>(found);
      d.first_outputs_differ->inner_op = ra[found].op;
    }
  }
  if (!d.misaligned_at && i == n && ra.size() != rb.size() &&
      !(d.first_inputs_differ && d.first_outputs_differ)) {
    d.misaligned_at = static_cast<int64_t>(n);
    d.misaligned_reason = "length";
  }
  if (d.first_inputs_differ &&
      (!d.first_outputs_differ || d.first_outputs_differ->index > d.first_inputs_differ->index)) {
    d.entered_after = d.first_inputs_differ->index - 1;
  }
  return d;
}

std::string OperatorDivergenceSummary(const OperatorDivergence& d) {
  if (!d.diverged()) {
    return absl::StrCat("no operator call differs: ", d.calls_a,
                        " calls, identical inputs and outputs in order");
  }
  std::vector<std::string> parts;
  if (d.first_outputs_differ) {
    const OperatorFinding& f = *d.first_outputs_differ;
    std::string s = absl::StrCat("first operator whose inputs matched and outputs differ: ", f.op,
                                 " in ", f.module, " (call ", f.index, ", ", f.reason, ")");
    if (f.inner_index >= 0) {
      absl::StrAppend(&s, ", innermost ", f.inner_op, " (call ", f.inner_index, ")");
    }
    if (!f.figures.empty()) {
      const OperatorFinding::OutputFigures& o = f.figures[0];
      absl::StrAppend(&s, absl::StrFormat(": sum %.9g vs %.9g (diff %.3g), max|x| %.9g vs %.9g",
                                          o.sum_a, o.sum_b, o.sum_diff, o.max_abs_a, o.max_abs_b));
    }
    parts.push_back(std::move(s));
  } else {
    parts.push_back("no operator with matching inputs produced differing outputs");
  }
  if (d.first_inputs_differ) {
    const OperatorFinding& f = *d.first_inputs_differ;
    parts.push_back(absl::StrCat("first operator whose inputs differ: ", f.op, " in ", f.module,
                                 " (call ", f.index, ", ", f.reason, ")"));
  }
  if (d.entered_after) {
    parts.push_back(absl::StrCat("the difference entered outside the operators, between call ",
                                 *d.entered_after,
                                 *d.entered_after >= 0 ? " (outputs matched)" : " (the start)",
                                 " and call ", d.first_inputs_differ->index));
  }
  if (d.misaligned_at) {
    parts.push_back(absl::StrCat("the recordings stop aligning at call ", *d.misaligned_at, " (",
                                 d.misaligned_reason, ")"));
  }
  return absl::StrJoin(parts, "; ");
}

json OperatorDivergenceJson(const OperatorDivergence& d) {
  return {{"diverged", d.diverged()},
          {"calls", {d.calls_a, d.calls_b}},
          {"first_outputs_differ", FindingJson(d.first_outputs_differ)},
          {"first_inputs_differ", FindingJson(d.first_inputs_differ)},
          {"entered_after", d.entered_after ? json(*d.entered_after) : json()},
          {"misaligned_at", d.misaligned_at ? json(*d.misaligned_at) : json()},
          {"misaligned_reason", d.misaligned_at ? json(d.misaligned_reason) : json()}};
}

}  // namespace numerics
}  // namespace lockstep
