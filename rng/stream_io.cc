#include "rng/stream_io.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace lockstep {
namespace rng {
namespace {

GeneratorSetProto ToProto(const RngSnapshot& snapshot) {
  GeneratorSetProto proto;
  proto.set_cpu_state(snapshot.cpu_state());
  if (snapshot.cuda().has_value()) {
    proto.mutable_cuda()->set_device(snapshot.cuda()->device);
    proto.mutable_cuda()->set_seed(snapshot.cuda()->seed);
    proto.mutable_cuda()->set_offset(snapshot.cuda()->offset);
  }
  return proto;
}

absl::StatusOr<RngSnapshot> FromProto(const GeneratorSetProto& proto, int cuda_device,
                                      const std::string& what) {
  std::optional<CudaGeneratorState> cuda;
  if (proto.has_cuda()) {
    cuda = CudaGeneratorState{proto.cuda().device(), proto.cuda().seed(), proto.cuda().offset()};
  }
  const int saved_device = cuda.has_value() ? cuda->device : -1;
  if (saved_device != cuda_device) {
    return absl::InvalidArgumentError(absl::StrCat(what, " was saved for CUDA device ",
                                                   saved_device, ", this rank uses ", cuda_device));
  }
  absl::StatusOr<RngSnapshot> snapshot = RngSnapshot::FromParts(proto.cpu_state(), cuda);
  if (!snapshot.ok()) return Annotate(snapshot.status(), absl::StrCat("in ", what));
  return snapshot;
}

}  // namespace

absl::StatusOr<RngStreamsProto> CaptureStreams(const DefaultGenerators& generators,
                                               const ModelStream& model,
                                               const NamedStreamTracker* tracker) {
  if (model.in_scope()) {
    return absl::FailedPreconditionError(
        "cannot capture RNG streams inside a model-stream scope: the live generators hold the "
        "model stream, not the caller's state");
  }
  if (!(model.generators() == generators)) {
    return absl::InvalidArgumentError("the model stream uses other generators than the caller");
  }
  if (tracker != nullptr) {
    if (!(tracker->generators() == generators)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the named-stream tracker uses CUDA device ", tracker->generators().cuda_device,
          ", the caller's generators ", generators.cuda_device));
    }
    if (tracker->forked()) {
      return absl::FailedPreconditionError(
          "cannot capture RNG streams during a named-stream fork: the live generators hold the "
          "named stream, not the caller's state");
    }
  }
  LOCKSTEP_ASSIGN_OR_RETURN(RngSnapshot caller, RngSnapshot::Capture(generators));
  if (caller.cuda().has_value() && caller.cuda()->in_capture.has_value()) {
    return absl::FailedPreconditionError(
        "cannot capture RNG streams for a checkpoint during CUDA graph capture: the CUDA "
        "generator's position there is graph-relative and only known at replay");
  }
  RngStreamsProto proto;
  proto.set_version(kRngStreamsVersion);
  proto.set_cuda_device(generators.cuda_device);
  *proto.mutable_caller() = ToProto(caller);
  if (model.state().has_value()) *proto.mutable_model() = ToProto(*model.state());
  if (tracker != nullptr) {
    for (const auto& [name, stream] : tracker->streams()) {
      NamedStreamProto* named = proto.add_named();
      named->set_name(name);
      named->set_seed(stream.seed);
      *named->mutable_state() = ToProto(stream.state);
    }
  }
  return proto;
}

absl::Status RestoreStreams(const RngStreamsProto& saved, ModelStream& model,
                            NamedStreamTracker* tracker) {
  if (saved.version() != kRngStreamsVersion) {
    return absl::InvalidArgumentError(absl::StrCat("RNG streams version ", saved.version(),
                                                   " is not the supported version ",
                                                   kRngStreamsVersion));
  }
  const int device = model.generators().cuda_device;
  if (saved.cuda_device() != device) {
    return absl::InvalidArgumentError(absl::StrCat("RNG streams were saved for CUDA device ",
                                                   saved.cuda_device(), ", this rank uses ",
                                                   device));
  }
  if (model.in_scope()) {
    return absl::FailedPreconditionError("cannot restore RNG streams inside a model-stream scope");
  }
  // Validate everything first; change nothing until all of it parses.
  LOCKSTEP_ASSIGN_OR_RETURN(RngSnapshot caller, FromProto(saved.caller(), device, "caller state"));
  std::optional<RngSnapshot> model_state;
  if (saved.has_model()) {
    LOCKSTEP_ASSIGN_OR_RETURN(model_state, FromProto(saved.model(), device, "model stream"));
  }
  std::map<std::string, NamedStreamTracker::Stream> named;
  std::map<uint64_t, std::string> seeds;
  for (const NamedStreamProto& stream : saved.named()) {
    LOCKSTEP_ASSIGN_OR_RETURN(
        RngSnapshot state,
        FromProto(stream.state(), device, absl::StrCat("named stream '", stream.name(), "'")));
    if (!named.emplace(stream.name(), NamedStreamTracker::Stream{stream.seed(), state}).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("named stream '", stream.name(), "' appears twice"));
    }
    auto [other, fresh] = seeds.emplace(stream.seed(), stream.name());
    if (!fresh) {
      return absl::InvalidArgumentError(absl::StrCat("named streams '", other->second, "' and '",
                                                     stream.name(), "' share seed ",
                                                     stream.seed()));
    }
  }
  if (!named.empty() && tracker == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("the saved streams have ", named.size(),
                                                   " named stream(s) but no tracker was given"));
  }
  if (tracker != nullptr && tracker->forked()) {
    return absl::FailedPreconditionError("cannot restore RNG streams during a named-stream fork");
  }
  if (tracker != nullptr && !(tracker->generators() == model.generators())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the named-stream tracker uses CUDA device ", tracker->generators().cuda_device,
        ", the model stream ", model.generators().cuda_device));
  }
  // The live generators first: the only step that can still fail (it writes both generators or
  // neither). The model stream and tracker, validated above, then cannot fail.
  LOCKSTEP_RETURN_IF_ERROR(caller.Restore());
  LOCKSTEP_RETURN_IF_ERROR(model.Restore(std::move(model_state)));
  if (tracker != nullptr) {
    LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(tracker->Restore(std::move(named)),
                                          "while restoring named streams");
  }
  return absl::OkStatus();
}

}  // namespace rng
}  // namespace lockstep
