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
  int64_t index = 0;   // the call's index, the same in both recordings
  std::string op;      // its operator (RecordFunction's name), the same in both
  std::string module;  // the label of the scope it ran in, the same in both
  // "inputs digest", "inputs structure", "outputs digest", "outputs structure".
  std::string reason;
  OperatorRecord a;  // the call as `a` recorded it
  OperatorRecord b;  // the call as `b` recorded it
  // For an outputs finding, per output tensor present in both: the summaries and their
  // differences (b - a).
  struct OutputFigures {
    int arg = 0;           // the output's position among the call's returns (OperatorValue::arg)
    int item = -1;         // its position in a list return; -1: the return itself
    double sum_a = 0,      // the output's sum in `a`
        sum_b = 0,         // its sum in `b`
        sum_diff = 0;      // sum_b - sum_a
    double max_abs_a = 0,  // the output's max |x| in `a`
        max_abs_b = 0,     // its max |x| in `b`
        max_abs_diff = 0;  // max_abs_b - max_abs_a
  };
  // One entry per output tensor (kind "tensor") present in both records, in `a`'s output order.
  std::vector<OutputFigures> figures;
  // (b) only: the innermost call inside this one whose inputs also matched and whose outputs
  // also differ (aten::mean computing through aten::sum), when there is one; -1 otherwise.
  int64_t inner_index = -1;
  // That call's operator (empty when inner_index is -1).
  std::string inner_op;
};

// What FirstOperatorDivergence found: (a) and (b) of the top of this file, where the difference
// entered, and where the recordings stop aligning.
struct OperatorDivergence {
  int64_t calls_a = 0;  // the calls recorded in `a`
  int64_t calls_b = 0;  // the calls recorded in `b`
  // (a) The first call whose inputs already differed.
  std::optional<OperatorFinding> first_inputs_differ;
  // (b) The first call whose inputs matched and whose outputs differ: the nondeterministic one.
  // Both findings are calls the program made itself, not calls inside them (Note [Calls inside
  // calls] in op_divergence.cc).
  std::optional<OperatorFinding> first_outputs_differ;
  // When (a) comes before any (b): the difference entered outside the operators, after call
  // `entered_after` (-1: before the first call) whose outputs matched, and before (a).
  std::optional<int64_t> entered_after;
  // Where the recordings stop aligning: the first index whose operator, module or parent differ
  // ("structure") or where one recording ended ("length"); the walk stops there.
  std::optional<int64_t> misaligned_at;
  // "structure" or "length" when misaligned_at is set; empty otherwise.
  std::string misaligned_reason;
  // Whether anything differs: a finding, or recordings that stop aligning.
  bool diverged() const { return first_inputs_differ || first_outputs_differ || misaligned_at; }
};

// Walks `a` and `b` call by call (see the top of this file) until both findings are made or the
// recordings stop aligning; only calls the program made itself (depth 0) are compared.
OperatorDivergence FirstOperatorDivergence(const OperatorRecording& a, const OperatorRecording& b);

// One line of prose per finding, for tools and check details.
std::string OperatorDivergenceSummary(const OperatorDivergence& divergence);

// A call's line of an operator recording (declared in op_recording.h).
nlohmann::json OperatorRecordJson(const OperatorRecord& record);
// {"diverged", "calls": [a, b], "first_inputs_differ", "first_outputs_differ", "entered_after",
//  "misaligned_at", "misaligned_reason"}; absent findings are null.
nlohmann::json OperatorDivergenceJson(const OperatorDivergence& divergence);

}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_OP_DIVERGENCE_H_
