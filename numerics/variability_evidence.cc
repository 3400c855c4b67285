#include "numerics/variability_evidence.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file_io.h"
#include "base/json.h"
#include "base/status_macros.h"
#include "numerics/compare.h"
#include "numerics/execution_context.h"
#include "numerics/safetensors.h"

namespace lockstep {
namespace numerics {
namespace {

using nlohmann::json;

// An actor's evidence is small (an inventory and a context); far below this.
constexpr size_t kMaxActorEvidenceBytes = size_t{256} << 20;

absl::StatusOr<json> ReadActorJson(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path, kMaxActorEvidenceBytes);
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrCat("no actor evidence at '", path, "'"));
  }
  LOCKSTEP_RETURN_IF_ERROR(text.status());
  absl::StatusOr<json> parsed = ParseJson(*text, path);
  if (!parsed.ok() || !parsed->is_object() || !parsed->contains("inventory") ||
      !parsed->contains("context") || !(*parsed)["inventory"].is_object() ||
      !(*parsed)["context"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not an actor's evidence",
                     parsed.ok() ? "" : absl::StrCat(": ", parsed.status().message())));
  }
  return *std::move(parsed);
}

}  // namespace

absl::StatusOr<json> RecordComparisons(const Recording& a, const Recording& b) {
  json records = json::array();
  const size_t n = std::min(a.records().size(), b.records().size());
  for (size_t i = 0; i < n; ++i) {
    const Record& ra = a.records()[i];
    const Record& rb = b.records()[i];
    json entry = {{"index", ra.index},
                  {"module", ra.module},
                  {"kind", RecordKindName(ra.kind)},
                  {"digest_equal", ra.digest == rb.digest}};
    if (ra.module != rb.module || ra.kind != rb.kind || !ra.tensor.defined() ||
        !rb.tensor.defined()) {
      entry["structure_differs"] = ra.module != rb.module || ra.kind != rb.kind;
      records.push_back(std::move(entry));
      continue;
    }
    LOCKSTEP_ASSIGN_OR_RETURN(TensorComparison c,
                              CompareTensors(rb.tensor, ra.tensor, Tolerance()));
    const json figures = ComparisonJson(c);
    for (const char* key : {"outcome", "bitwise_equal", "max_abs_diff", "max_tolerance_ratio",
                            "relative_l2", "elements"}) {
      entry[key] = figures[key];
    }
    records.push_back(std::move(entry));
  }
  return records;
}

absl::StatusOr<RecordingsVerdict> CompareRecordings(const Recording& a, const Recording& b) {
  RecordingsVerdict verdict;
  LOCKSTEP_ASSIGN_OR_RETURN(verdict.first, FirstDivergence(a, b));
  LOCKSTEP_ASSIGN_OR_RETURN(json records, RecordComparisons(a, b));
  json leaves = json::array();
  std::map<std::string, int> verdicts;
  for (const Record& r : a.records()) {
    if (r.kind != RecordKind::kAccumulatedGradient) continue;
    absl::StatusOr<GradientLocalization> leaf = LocalizeParameterGradient(a, b, r.module);
    if (!leaf.ok()) {
      leaves.push_back({{"parameter", r.module}, {"error", leaf.status().ToString()}});
      ++verdicts["unlocalized"];
      continue;
    }
    if (leaf->verdict == GradientLocalization::kSame) continue;
    leaves.push_back(GradientLocalizationJson(*leaf));
    ++verdicts[GradientVerdictName(leaf->verdict)];
  }
  std::vector<std::string> counts;
  for (const auto& [name, count] : verdicts) counts.push_back(absl::StrCat(count, " ", name));
  verdict.leaves_summary = counts.empty() ? "every parameter's accumulated gradient identical"
                                          : absl::StrCat("parameters whose gradient differs: ",
                                                         absl::StrJoin(counts, ", "));
  verdict.evidence = {{"first_divergence", DivergenceJson(verdict.first)},
                      {"records", std::move(records)},
                      {"leaf_gradients", std::move(leaves)}};
  return verdict;
}

std::string DivergenceSummary(const std::optional<Divergence>& first) {
  if (!first.has_value()) return "no module record differs";
  std::string s =
      absl::StrCat("first divergence at ", first->module, " (", RecordKindName(first->kind),
                   ", record ", first->index, ", ", first->reason, ")");
  if (first->comparison.has_value()) {
    const TensorComparison& c = *first->comparison;
    absl::StrAppend(&s, absl::StrFormat(": max |diff| %.3g, relative L2 %.3g, tolerance ratio %.3g",
                                        c.max_abs_diff, c.relative_l2, c.max_tolerance_ratio));
  }
  return s;
}

absl::StatusOr<VerdictEvidence> RepeatabilityEvidence(const RepeatabilityReport& report,
                                                      const std::vector<Recording>& passes,
                                                      const Tolerance& tolerance) {
  if (passes.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("repeatability needs the recordings of 3 passes (cold, warm1, warm2), not ",
                     passes.size()));
  }
  VerdictEvidence check;
  check.passed = report.repeatable();
  // The pair to localize: warm1 against cold, or (when those agree) warm2 against warm1.
  const bool cold_differs = !report.warm1_vs_cold.all_passed();
  const Recording& a = cold_differs ? passes[0] : passes[1];
  const Recording& b = cold_differs ? passes[1] : passes[2];
  LOCKSTEP_ASSIGN_OR_RETURN(RecordingsVerdict verdict, CompareRecordings(a, b));
  check.evidence = verdict.evidence;
  check.evidence["compared"] = cold_differs ? "warm1 vs cold" : "warm2 vs warm1";
  check.evidence["report"] = RepeatabilityJson(report);
  check.evidence["context"] = CaptureExecutionContext();
  const SetComparison& set = report.warm1_vs_cold;
  if (check.passed) {
    check.detail = absl::StrCat("cold, warm1, warm2: ", set.passed, " outputs and gradients ",
                                tolerance.bitwise ? "bit-identical" : "within the tolerance", ", ",
                                a.records().size(), " module and leaf records identical");
  } else {
    const SetComparison& failed = cold_differs ? set : report.warm2_vs_warm1;
    check.detail =
        absl::StrCat(cold_differs ? "warm1 vs cold" : "warm2 vs warm1", ": ", failed.failed, " of ",
                     failed.passed + failed.failed, " outputs and gradients differ; ",
                     DivergenceSummary(verdict.first), "; ", verdict.leaves_summary);
  }
  return check;
}

std::vector<std::string> InventoryDifferences(const json& a, const json& b) {
  std::map<std::string, std::pair<std::string, std::string>> digests;
  for (const json& e : a.value("entries", json::array())) {
    digests[e.value("name", "")].first = e.value("digest", "");
  }
  for (const json& e : b.value("entries", json::array())) {
    digests[e.value("name", "")].second = e.value("digest", "");
  }
  std::vector<std::string> differ;
  for (const auto& [name, pair] : digests) {
    if (pair.first != pair.second) differ.push_back(name);
  }
  if (differ.empty() && a.value("state_digest", "") != b.value("state_digest", "")) {
    differ.push_back("state digest");
  }
  return differ;
}

std::string ActorEvidenceBase(const std::string& prefix, int rank) {
  return absl::StrCat(prefix, ".rank", rank);
}

absl::Status WriteActorEvidence(const std::string& prefix, int rank,
                                const ActorEvidence& evidence) {
  const std::string base = ActorEvidenceBase(prefix, rank);
  NamedTensors tensors;
  for (const auto& [name, tensor] : evidence.outputs)
    tensors.emplace_back("output/" + name, tensor);
  for (const auto& [name, tensor] : evidence.gradients)
    tensors.emplace_back("grad/" + name, tensor);
  LOCKSTEP_RETURN_IF_ERROR(evidence.recording.Save(base + ".rec"));
  LOCKSTEP_RETURN_IF_ERROR(
      WriteSafetensors(base + ".safetensors", tensors, ContextMetadata(evidence.context)));
  const json record = {{"inventory", evidence.inventory},
                       {"context", evidence.context},
                       {"saved_vs_loaded", evidence.saved_vs_loaded}};
  return WriteFileAtomically(base + ".json", DumpJson(record, 1));
}

absl::StatusOr<VerdictEvidence> CompareActorEvidence(const std::string& prefix_a,
                                                     const std::string& prefix_b, int rank) {
  const std::string a_base = ActorEvidenceBase(prefix_a, rank);
  const std::string b_base = ActorEvidenceBase(prefix_b, rank);
  LOCKSTEP_ASSIGN_OR_RETURN(json a, ReadActorJson(a_base + ".json"));
  LOCKSTEP_ASSIGN_OR_RETURN(json b, ReadActorJson(b_base + ".json"));
  LOCKSTEP_ASSIGN_OR_RETURN(SafetensorsFile a_file, SafetensorsFile::Open(a_base + ".safetensors"));
  LOCKSTEP_ASSIGN_OR_RETURN(SafetensorsFile b_file, SafetensorsFile::Open(b_base + ".safetensors"));
  LOCKSTEP_ASSIGN_OR_RETURN(NamedTensors a_tensors, a_file.Tensors());
  LOCKSTEP_ASSIGN_OR_RETURN(NamedTensors b_tensors, b_file.Tensors());
  LOCKSTEP_ASSIGN_OR_RETURN(Recording a_rec, Recording::Load(a_base + ".rec"));
  LOCKSTEP_ASSIGN_OR_RETURN(Recording b_rec, Recording::Load(b_base + ".rec"));

  const std::vector<std::string> inventory_differs =
      InventoryDifferences(a["inventory"], b["inventory"]);
  const std::vector<std::string> context_differs = ContextDifferences(a["context"], b["context"]);
  LOCKSTEP_ASSIGN_OR_RETURN(SetComparison tensors,
                            CompareTensorSets(b_tensors, a_tensors, Tolerance::Bitwise()));
  LOCKSTEP_ASSIGN_OR_RETURN(RecordingsVerdict verdict, CompareRecordings(a_rec, b_rec));

  // Each actor against what was saved: two actors whose loads restored the same too little agree
  // with each other.
  std::vector<std::string> restored_less;
  for (const auto& [label, actor] : {std::pair<const char*, const json*>{"a", &a}, {"b", &b}}) {
    const json less = actor->value("saved_vs_loaded", json::array());
    if (!less.is_array() || less.empty()) continue;
    restored_less.push_back(
        absl::StrCat("actor ", label, "'s load restored less than was saved: ", less.size(),
                     " inventory entries differ (first: ",
                     less[0].is_string() ? less[0].get<std::string>() : "?", ")"));
  }

  VerdictEvidence check;
  check.passed = restored_less.empty() && inventory_differs.empty() && context_differs.empty() &&
                 tensors.all_passed();
  check.evidence = verdict.evidence;
  check.evidence["inventory_a"] = a["inventory"];
  check.evidence["inventory_b"] = b["inventory"];
  check.evidence["inventory_differences"] = inventory_differs;
  check.evidence["saved_vs_loaded_a"] = a.value("saved_vs_loaded", json::array());
  check.evidence["saved_vs_loaded_b"] = b.value("saved_vs_loaded", json::array());
  check.evidence["context_a"] = a["context"];
  check.evidence["context_b"] = b["context"];
  check.evidence["context_differences"] = context_differs;
  check.evidence["tensors"] = SetComparisonJson(tensors);
  const std::string state = absl::StrCat(a["inventory"].value("tensors", 0), " tensors, digest ",
                                         a["inventory"].value("state_digest", "").substr(0, 12));
  if (check.passed) {
    check.detail =
        absl::StrCat("two actor processes loaded the same state: inventories equal (", state,
                     "), contexts equal (digest ", ContextDigest(a["context"]).substr(0, 12), "), ",
                     tensors.passed, " outputs and gradients bit-identical");
    return check;
  }
  std::vector<std::string> parts = restored_less;
  if (!inventory_differs.empty()) {
    parts.push_back(absl::StrCat(inventory_differs.size(),
                                 " inventory entries differ (first: ", inventory_differs[0], ")"));
  }
  if (!context_differs.empty()) {
    parts.push_back(absl::StrCat("contexts differ in ", absl::StrJoin(context_differs, ", ")));
  }
  if (!tensors.all_passed()) {
    parts.push_back(absl::StrCat(tensors.failed, " of ", tensors.passed + tensors.failed,
                                 " outputs and gradients differ; ",
                                 DivergenceSummary(verdict.first), "; ", verdict.leaves_summary));
  }
  check.detail = absl::StrJoin(parts, "; ");
  return check;
}

}  // namespace numerics
}  // namespace lockstep
