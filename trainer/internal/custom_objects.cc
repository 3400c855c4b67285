#include "trainer/internal/custom_objects.h"

#include <optional>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/core/grad_mode.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "collectives/agreement.h"
#include "collectives/outcome.h"
#include "rng/snapshot.h"

namespace lockstep {
namespace trainer {
namespace internal {
namespace {

// The fields a tensor's structure is compared on, in the order DescribeStructure writes them.
constexpr const char* kFields[] = {"name", "shape", "dtype", "requires_grad", "device type"};

std::vector<std::string> FieldsOf(const std::string& name, const at::Tensor& t) {
  if (!t.defined()) return {name, "undefined", "-", "-", "-"};
  return {name, absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]"),
          std::string(c10::toString(t.scalar_type())), t.requires_grad() ? "grad" : "no-grad",
          c10::DeviceTypeName(t.device().type(), /*lower_case=*/true)};
}

// The first difference between the leader's description and another member's, in group-rank
// order, as every member words it alike.
std::string FirstDifference(const collectives::Communicator& group,
                            const std::vector<std::string>& descriptions) {
  const std::vector<std::string> leader = absl::StrSplit(descriptions[0], '\n', absl::SkipEmpty());
  const int leader_global = group.global_ranks()[0];
  for (int m = 1; m < group.size(); ++m) {
    const std::vector<std::string> theirs =
        absl::StrSplit(descriptions[m], '\n', absl::SkipEmpty());
    const int global = group.global_ranks()[m];
    for (size_t i = 0; i < std::max(leader.size(), theirs.size()); ++i) {
      if (i >= leader.size() || i >= theirs.size()) {
        return absl::StrCat("global rank ", global, "'s factory returned ", theirs.size(),
                            " tensors, the leader's (global rank ", leader_global, ") ",
                            leader.size());
      }
      const std::vector<std::string> a = absl::StrSplit(leader[i], '\t');
      const std::vector<std::string> b = absl::StrSplit(theirs[i], '\t');
      for (size_t f = 0; f < a.size() && f < b.size(); ++f) {
        if (a[f] == b[f]) continue;
        return absl::StrCat("global rank ", global, "'s factory returned tensor ", i, " ('", b[0],
                            "') with ", kFields[f], " ", b[f], ", the leader's (global rank ",
                            leader_global, ") ", a[f]);
      }
    }
  }
  return "the members' structures differ";
}

}  // namespace

std::string DescribeStructure(const numerics::NamedTensors& tensors) {
  std::string text;
  for (const auto& [name, tensor] : tensors) {
    absl::StrAppend(&text, absl::StrJoin(FieldsOf(name, tensor), "\t"), "\n");
  }
  return text;
}

absl::StatusOr<numerics::NamedTensors> CustomObjectRegistry::Register(
    collectives::Communicator* group, rng::RankStreams& streams,
    const std::function<absl::Status()>& synchronize, const std::string& where,
    const std::string& name, const std::string& metadata, const CustomObjectFactory& factory) {
  if (!factory) return absl::InvalidArgumentError(absl::StrCat(where, ": no factory given"));
  if (group != nullptr) {
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
        collectives::CheckAgreement(*group, "trainer/register_object",
                                    absl::StrCat(name, "\n", metadata)),
        where);
  }
  // Every replica holds the same registrations (each was agreed), so each decides alike.
  if (auto it = objects_.find(name); it != objects_.end()) {
    if (it->second.metadata != metadata) {
      return absl::AlreadyExistsError(absl::StrCat(where, ": registered already with metadata '",
                                                   it->second.metadata,
                                                   "'; refusing another kind ('", metadata, "')"));
    }
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(synchronize(), where);
    return it->second.tensors;
  }
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(synchronize(), where);
  // Where the factory starts drawing, to undo its draws if nothing is registered.
  LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot before,
                            rng::RngSnapshot::Capture(streams.generators()));
  auto undo = [&](absl::Status status) {
    absl::Status restored = before.Restore();
    if (!restored.ok())
      return Annotate(status,
                      absl::StrCat("(restoring the caller's RNG: ", restored.message(), ")"));
    return status;
  };
  numerics::NamedTensors tensors;
  absl::Status local = CallTorch("the factory", [&]() -> absl::Status {
    LOCKSTEP_ASSIGN_OR_RETURN(tensors, factory());
    return absl::OkStatus();
  });
  LOCKSTEP_ASSIGN_OR_RETURN(collectives::GroupOutcome outcome,
                            collectives::AgreeOnOutcome(group, local));
  if (!outcome.ok()) {
    return undo(
        outcome.ForMember(local, absl::StrCat(where, ": the factory (nothing registered)")));
  }
  if (collectives::WithOthers(group) != nullptr) {
    absl::Status agreed = collectives::CheckAgreement(
        *group, "trainer/custom_object_structure", DescribeStructure(tensors),
        [&](const std::vector<std::string>& all) {
          return absl::StrCat("the replicas' factories returned different objects: ",
                              FirstDifference(*group, all));
        });
    if (!agreed.ok()) return undo(Annotate(agreed, absl::StrCat(where, "; nothing registered")));
    LOCKSTEP_RETURN_IF_ERROR(CallTorch(where, [&]() -> absl::Status {
      at::AutoGradMode no_grad(false);
      for (auto& [tensor_name, tensor] : tensors) {
        if (!tensor.defined()) continue;
        at::Tensor contiguous = tensor.is_contiguous() ? tensor : tensor.contiguous();
        LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(group->Broadcast(contiguous, 0),
                                              absl::StrCat("broadcasting '", tensor_name, "'"));
        if (!contiguous.is_same(tensor)) tensor.copy_(contiguous);
      }
      return absl::OkStatus();
    }));
  }
  objects_.emplace(name, Entry{metadata, tensors});
  return tensors;
}

}  // namespace internal
}  // namespace trainer
}  // namespace lockstep
