#include "rng/rank_streams.h"

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace rng {

RankStreams::RankStreams(DefaultGenerators generators)
    : generators_(generators), model_(*this), named_(*this) {}

absl::StatusOr<std::shared_ptr<RankStreams>> RankStreams::Create(DefaultGenerators generators) {
  if (generators.has_cuda()) {
    if (absl::Status s = internal::RequireCudaSupport(generators.cuda_device); !s.ok()) return s;
  }
  return std::shared_ptr<RankStreams>(new RankStreams(generators));
}

absl::Status RankStreams::CheckGenerators(const RngSnapshot& snapshot,
                                          absl::string_view what) const {
  return CheckGenerators(snapshot.generators(), what);
}

absl::Status RankStreams::CheckGenerators(const DefaultGenerators& generators,
                                          absl::string_view what) const {
  if (generators == generators_) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " holds state for CUDA device ", generators.cuda_device,
      ", but this rank's generators use CUDA device ", generators_.cuda_device, " (-1: none)"));
}

}  // namespace rng
}  // namespace lockstep
