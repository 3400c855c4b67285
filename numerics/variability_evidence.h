// numerics/variability_evidence.h
//
// The evidence of the two variability checks any program can run, whether it is qualify's
// reference model (qualification/variability.h) or a user's PyTorch program driven from Python
// (lockstep.variability, lockstep.verify):
//
//   repeatability  one process runs its step cold, warm1 and warm2 (repeatability.h), each pass
//                  recorded module by module (divergence.h); RepeatabilityEvidence turns the
//                  harness's report and the three recordings into a verdict, its detail and the
//                  evidence (per-record figures, the first divergence, and per parameter whether
//                  its gradient first differs in an incoming contribution or in the accumulation).
//   actors         two fresh processes load one saved state; each writes its evidence with
//                  WriteActorEvidence (inventory, execution context, what its load restored less
//                  than was saved, outputs and gradients, its recording) and CompareActorEvidence
//                  compares the two: equal inventories, equal contexts (else the differing fields
//                  named) and bit-identical outputs and gradients, else the first divergence.
//
// The evidence is the JSON qualify's evidence file holds per rank (report/report.py draws it).
//
// An actor's files, for `prefix` and rank r:
//   <prefix>.rank<r>.json          {"inventory", "context", "saved_vs_loaded": [names]}
//   <prefix>.rank<r>.safetensors   "output/<name>" and "grad/<parameter>", the context in its
//                                  metadata
//   <prefix>.rank<r>.rec           the recording (divergence.h)
//
// Thread-safety: stateless functions.

#ifndef LOCKSTEP_NUMERICS_VARIABILITY_EVIDENCE_H_
#define LOCKSTEP_NUMERICS_VARIABILITY_EVIDENCE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "numerics/divergence.h"
#include "numerics/named_tensors.h"
#include "numerics/repeatability.h"

namespace lockstep {
namespace numerics {

// Every record of `a` against its counterpart in `b`, in execution order: {index, module, kind,
// digest_equal} and, where both kept their tensors, the figures of CompareTensors under the
// default tolerance (outcome, bitwise_equal, max_abs_diff, max_tolerance_ratio, relative_l2,
// elements).
absl::StatusOr<nlohmann::json> RecordComparisons(const Recording& a, const Recording& b);

// Two recordings compared: the first divergence, and each tapped parameter's localization.
struct RecordingsVerdict {
  // The first record that differs (FirstDivergence), or nullopt.
  std::optional<Divergence> first;
  // "parameters whose gradient differs: 3 incoming, 1 accumulation", or that none does.
  std::string leaves_summary;
  // {first_divergence, records (RecordComparisons), leaf_gradients: [localization...]}.
  nlohmann::json evidence;
};
// `a` against `b`: FirstDivergence, RecordComparisons and LocalizeParameterGradient for every
// parameter `a` recorded an accumulated gradient of.
absl::StatusOr<RecordingsVerdict> CompareRecordings(const Recording& a, const Recording& b);

// "first divergence at block1.mlp (forward_output, record 4, digest): max |diff| ..." or that no
// record differs.
std::string DivergenceSummary(const std::optional<Divergence>& first);

// A check's outcome: whether it passed, one line saying why, and every figure behind it.
struct VerdictEvidence {
  bool passed = false;      // whether the check passed
  std::string detail;       // one line: what was compared and, on failure, where it differs
  nlohmann::json evidence;  // every figure behind the verdict (qualify's evidence per rank)
};

// The repeatability check from the harness's report and the recordings of its three passes
// (cold, warm1, warm2, in that order): the pair localized is warm1 against cold when those
// differ, else warm2 against warm1; `tolerance` is the one the harness compared under (the detail
// says "bit-identical" for a bitwise one). kInvalidArgument unless there are three recordings.
absl::StatusOr<VerdictEvidence> RepeatabilityEvidence(const RepeatabilityReport& report,
                                                      const std::vector<Recording>& passes,
                                                      const Tolerance& tolerance);

// The names whose digests differ between two inventories' JSON (InventoryJson), or that only one
// holds, sorted; "state digest" when every entry agrees but the state digests do not.
std::vector<std::string> InventoryDifferences(const nlohmann::json& a, const nlohmann::json& b);

// What one actor writes (see the top of this file).
struct ActorEvidence {
  // The inventory (InventoryJson) of the state the actor holds after loading.
  nlohmann::json inventory;
  // Its execution context (CaptureExecutionContext).
  nlohmann::json context;
  // InventoryDifferences(what was saved, `inventory`): empty when the load restored everything.
  std::vector<std::string> saved_vs_loaded;
  // The step's outputs, by name (written as "output/<name>").
  NamedTensors outputs;
  // The parameters' gradients after the step, by name (written as "grad/<name>").
  NamedTensors gradients;
  // The step's recording.
  Recording recording{{}};
};

// The base path of an actor's files: "<prefix>.rank<rank>".
std::string ActorEvidenceBase(const std::string& prefix, int rank);

// Writes `evidence` as the files above (each atomically). I/O errors as base/file_io.h's.
absl::Status WriteActorEvidence(const std::string& prefix, int rank, const ActorEvidence& evidence);

// The actors check of rank `rank` from the evidence written under `prefix_a` and `prefix_b`.
// An error only when a file is missing (kNotFound naming it) or malformed (kInvalidArgument).
absl::StatusOr<VerdictEvidence> CompareActorEvidence(const std::string& prefix_a,
                                                     const std::string& prefix_b, int rank);

}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_VARIABILITY_EVIDENCE_H_
