// python/src/planner_names.h
//
// The planner's options by their Python names, for every binding that takes them (planner,
// trainer): packing "first_fit_decreasing" | "in_order"; loss normalization "token_mean" |
// "sum" | "sequence_mean". Another name raises ValueError listing the known ones.

#ifndef LOCKSTEP_PYTHON_SRC_PLANNER_NAMES_H_
#define LOCKSTEP_PYTHON_SRC_PLANNER_NAMES_H_

#include <string>

#include "planner/plan.pb.h"

namespace lockstep {
namespace python {

planner::PackingPolicy PackingNamed(const std::string& name);
planner::LossNormalization LossNormalizationNamed(const std::string& name);

}  // namespace python
}  // namespace lockstep

#endif  // LOCKSTEP_PYTHON_SRC_PLANNER_NAMES_H_
