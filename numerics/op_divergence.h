// numerics/op_divergence.h
//
// First divergence at the single ATen operator. The module recorder (numerics/divergence.h) names
// the first module whose output differs between two runs; inside that module it cannot say which
// operator computed different bits from the same inputs. FirstOperatorDivergence walks two
// operator recordings (op_recording.h) of the same computation — two processes, two actors, one
// sequence alone and packed among others — and reports separately
//   (a) the first operator whose inputs already differed, and
//   (b) the first whose inputs matched and whose outputs differ: the nondeterministic (or
//       placement-dependent) operator itself, with its outputs' sums and max |x| side by side.
// When (a) comes first, the difference entered outside the operators, between the previous call
// and that one (a write through a data pointer, a collective, an input the caller changed).
//
// Thread-safety: pure functions.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(auto a, numerics::OperatorRecording::Load("ops.a.jsonl"));
//   LOCKSTEP_ASSIGN_OR_RETURN(auto b, numerics::OperatorRecording::Load("ops.b.jsonl"));
//   numerics::OperatorDivergence d = numerics::FirstOperatorDivergence(a, b);
//   std::cout << numerics::OperatorDivergenceSummary(d);

#ifndef LOCKSTEP_NUMERICS_OP_DIVERGENCE_H_
#define LOCKSTEP_NUMERICS_OP_DIVERGENCE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json_fwd.hpp"
#include "numerics/op_recording.h"

namespace lockstep {
namespace numerics {

// One side-by-side finding of FirstOperatorDivergence.
struct OperatorFinding {
  int64_t index = 0;
  std::string op;
  std::string module;
  // "inputs digest", "inputs structure", "outputs digest", "outputs structure".
  std::string reason;
  OperatorRecord a;
  OperatorRecord b;
  // For an outputs finding, per output tensor present in both: the summaries and their
  // differences (b - a).
  struct OutputFigures {
    int arg = 0;
    int item = -1;
    double sum_a = 0, sum_b = 0, sum_diff = 0;
    double max_abs_a = 0, max_abs_b = 0, max_abs_diff = 0;
  };
  std::vector<OutputFigures> figures;
  // (b) only: the innermost call inside this one whose inputs also matched and whose outputs
  // also differ (aten::mean computing through aten::sum), when there is one; -1 otherwise.
  int64_t inner_index = -1;
  std::string inner_op;
};

struct OperatorDivergence {
  int64_t calls_a = 0;
  int64_t calls_b = 0;
  // (a) The first call whose inputs already differed.
  std::optional<OperatorFinding> first_inputs_differ;
  // (b) The first call whose inputs matched and whose outputs differ: the nondeterministic one.
  // Both findings are calls the program made itself, not calls inside them (Note [Calls inside
  // calls] in op_divergence.cc).
  std::optional<OperatorFinding> first_outputs_differ;
  // When (a) comes before any (b): the difference entered outside the operators, after call
  // `entered_after` (-1: before the first call) whose outputs matched, and before (a).
  std::optional<int64_t> entered_after;
  // Where the recordings stop aligning: the first index whose operator or module differ
  // ("structure") or where one recording ended ("length"); the walk stops there.
  std::optional<int64_t> misaligned_at;
  std::string misaligned_reason;
  bool diverged() const { return first_inputs_differ || first_outputs_differ || misaligned_at; }
};

OperatorDivergence FirstOperatorDivergence(const OperatorRecording& a, const OperatorRecording& b);

// One line of prose per finding, for tools and check details.
std::string OperatorDivergenceSummary(const OperatorDivergence& divergence);

nlohmann::json OperatorRecordJson(const OperatorRecord& record);
// {"diverged", "calls": [a, b], "first_inputs_differ", "first_outputs_differ", "entered_after",
//  "misaligned_at", "misaligned_reason"}; absent findings are null.
nlohmann::json OperatorDivergenceJson(const OperatorDivergence& divergence);

}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_OP_DIVERGENCE_H_
