#include "trainer/trainer_config.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace trainer {

std::string TrainerConfig::Canonical() const {
  // Every field the trainer reads, in declaration order; a field added above is added here.
  std::string text = absl::StrCat(
      "plan.max_tokens_per_microbatch=", plan.max_tokens_per_microbatch,
      ";plan.packing=", planner::PackingPolicy_Name(plan.packing),
      ";plan.loss_normalization=", planner::LossNormalization_Name(plan.loss_normalization),
      ";memory_model=", memory_model.has_value() ? memory_model->Serialize() : std::string("none"),
      ";memory_cap_bytes=", memory_cap_bytes,
      ";recovery.max_split_depth=", recovery.max_split_depth,
      ";activation_checkpointing=", activation_checkpointing ? 1 : 0);
  return text;
}

}  // namespace trainer
}  // namespace lockstep
