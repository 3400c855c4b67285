#include "python/src/planner_names.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "python/src/status.h"

namespace lockstep {
namespace python {
namespace {

template <typename Enum>
Enum Named(const std::string& name, const std::vector<std::pair<std::string, Enum>>& names,
           const std::string& what) {
  std::string known;
  for (const auto& [n, value] : names) {
    if (n == name) return value;
    absl::StrAppend(&known, known.empty() ? "" : ", ", n);
  }
  Raise(absl::InvalidArgumentError(absl::StrCat(what, " \"", name, "\" is not one of ", known)));
}

}  // namespace

planner::PackingPolicy PackingNamed(const std::string& name) {
  return Named<planner::PackingPolicy>(
      name,
      {{"first_fit_decreasing", planner::PACKING_FIRST_FIT_DECREASING},
       {"in_order", planner::PACKING_IN_ORDER}},
      "packing");
}

planner::LossNormalization LossNormalizationNamed(const std::string& name) {
  return Named<planner::LossNormalization>(name,
                                           {{"token_mean", planner::LOSS_TOKEN_MEAN},
                                            {"sum", planner::LOSS_SUM},
                                            {"sequence_mean", planner::LOSS_SEQUENCE_MEAN}},
                                           "loss_normalization");
}

}  // namespace python
}  // namespace lockstep
