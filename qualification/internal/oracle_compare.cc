#include "qualification/internal/oracle_compare.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"

namespace lockstep {
namespace qualification {
namespace internal {

absl::StatusOr<bool> AllEqualAcross(collectives::Communicator* group,
                                    const std::vector<at::Tensor>& tensors, int* disagreeing) {
  *disagreeing = 0;
  if (group == nullptr || tensors.empty()) return true;
  at::Tensor flat;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("flattening", [&] {
    std::vector<at::Tensor> parts;
    for (const at::Tensor& t : tensors) parts.push_back(t.flatten().to(at::kFloat));
    flat = at::cat(parts);
  }));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> all, group->AllGather(flat));
  for (const at::Tensor& other : all) {
    if (!at::equal(other, flat)) ++*disagreeing;
  }
  return *disagreeing == 0;
}

absl::Status CompareLists(const std::vector<at::Tensor>& actual,
                          const std::vector<at::Tensor>& expected, const std::string& what,
                          const numerics::Tolerance& tolerance, Figures& figures,
                          std::vector<std::string>& failures) {
  if (actual.size() != expected.size()) {
    failures.push_back(absl::StrCat(what, ": ", actual.size(), " tensors vs ", expected.size()));
    return absl::OkStatus();
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    if (actual[i].sizes() != expected[i].sizes()) {
      failures.push_back(absl::StrCat(what, " ", i, ": shapes differ"));
      continue;
    }
    LOCKSTEP_ASSIGN_OR_RETURN(
        numerics::TensorComparison c,
        numerics::CompareTensors(actual[i], expected[i], tolerance, absl::StrCat(what, " ", i)));
    if (!c.passed) failures.push_back(c.Summary());
    ++figures.compared;
    if (c.bitwise_equal) ++figures.bitwise_equal;
    figures.max_abs_diff = std::max(figures.max_abs_diff, c.max_abs_diff);
    figures.max_relative_l2 = std::max(figures.max_relative_l2, c.relative_l2);
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace qualification
}  // namespace lockstep
