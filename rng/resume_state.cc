#include "rng/resume_state.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "base/sha256_message.h"
#include "base/status_macros.h"
#include "rng/internal/resume_envelope.h"

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

// The snapshot `proto` holds, checked against the rank's generators.
absl::StatusOr<RngSnapshot> FromProto(const GeneratorSetProto& proto, const RankStreams& streams,
                                      const std::string& what) {
  std::optional<CudaGeneratorState> cuda;
  if (proto.has_cuda()) {
    cuda = CudaGeneratorState::Eager(proto.cuda().device(), proto.cuda().seed(),
                                     proto.cuda().offset());
  }
  absl::StatusOr<RngSnapshot> snapshot = RngSnapshot::FromParts(proto.cpu_state(), cuda);
  if (!snapshot.ok()) return Annotate(snapshot.status(), absl::StrCat("in ", what));
  LOCKSTEP_RETURN_IF_ERROR(streams.CheckGenerators(*snapshot, what));
  return snapshot;
}

// The structural checks SerializeResumeState and ParseResumeState share (RestoreResumeState
// repeats them against the rank's generators).
absl::Status CheckStructure(const RngResumeStateProto& saved) {
  if (saved.version() != kRngResumeStateVersion) {
    return absl::InvalidArgumentError(absl::StrCat("RNG resume state version ", saved.version(),
                                                   " is not the supported version ",
                                                   kRngResumeStateVersion));
  }
  if (saved.named_size() > kMaxNamedStreams) {
    return absl::InvalidArgumentError(
        absl::StrCat("the RNG resume state holds ", saved.named_size(),
                     " named streams; the limit is ", kMaxNamedStreams));
  }
  for (const NamedStreamProto& stream : saved.named()) {
    LOCKSTEP_RETURN_IF_ERROR(CheckStreamName(stream.name()));
  }
  return absl::OkStatus();
}

// The stream set an envelope lists for `saved`.
std::vector<std::string> StreamSet(const RngResumeStateProto& saved) {
  std::vector<std::string> streams = {"caller"};
  if (saved.has_model()) streams.push_back("model");
  for (const NamedStreamProto& stream : saved.named()) {
    streams.push_back(absl::StrCat("named/", stream.name()));
  }
  return streams;
}

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("corrupt RNG resume state: ", what));
}

}  // namespace

absl::StatusOr<std::string> SerializeResumeState(const RngResumeStateProto& saved) {
  LOCKSTEP_RETURN_IF_ERROR(CheckStructure(saved));
  RngResumeStateEnvelope envelope;
  envelope.set_format(kRngResumeEnvelopeFormat);
  for (std::string& stream : StreamSet(saved)) envelope.add_streams(std::move(stream));
  envelope.set_payload(SerializeDeterministically(saved));
  envelope.set_sha256(internal::ResumeEnvelopeDigest(envelope));
  std::string bytes = SerializeDeterministically(envelope);
  if (bytes.size() > kMaxResumeStateBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the sealed RNG resume state of ", bytes.size(),
                                                   " bytes exceeds the limit of ",
                                                   kMaxResumeStateBytes, " bytes"));
  }
  return bytes;
}

absl::StatusOr<RngResumeStateProto> ParseResumeState(absl::string_view bytes) {
  if (bytes.size() > kMaxResumeStateBytes) {
    return Corrupt(absl::StrCat(bytes.size(), " bytes exceed the limit of ", kMaxResumeStateBytes));
  }
  RngResumeStateEnvelope envelope;
  if (!envelope.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return Corrupt(absl::StrCat("the ", bytes.size(), " bytes are not an envelope"));
  }
  // Canonical encoding: appended messages, repeated or reordered fields, explicit defaults and
  // unknown fields all re-encode differently.
  if (SerializeDeterministically(envelope) != bytes) {
    return Corrupt("the envelope is not in canonical encoding (bytes appended or re-encoded)");
  }
  if (envelope.sha256() != internal::ResumeEnvelopeDigest(envelope)) {
    return Corrupt("the checksum does not match the contents");
  }
  if (envelope.format() != kRngResumeEnvelopeFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat("RNG resume state envelope format ", envelope.format(),
                     " is not the supported format ", kRngResumeEnvelopeFormat));
  }
  RngResumeStateProto saved;
  if (!saved.ParseFromString(envelope.payload()) ||
      SerializeDeterministically(saved) != envelope.payload()) {
    return Corrupt("the sealed payload is not a canonical resume state");
  }
  const std::vector<std::string> streams = StreamSet(saved);
  if (!std::equal(streams.begin(), streams.end(), envelope.streams().begin(),
                  envelope.streams().end())) {
    return Corrupt(absl::StrCat("the envelope lists ", envelope.streams_size(),
                                " streams, the payload holds ", streams.size(),
                                " that differ from them"));
  }
  LOCKSTEP_RETURN_IF_ERROR(CheckStructure(saved));
  return saved;
}

absl::StatusOr<RngResumeStateProto> CaptureResumeState(const RankStreams& streams) {
  if (streams.model().in_scope()) {
    return absl::FailedPreconditionError(
        "cannot capture the RNG resume state inside a model-stream scope: the live generators "
        "hold the model stream, not the caller's state");
  }
  if (streams.named().forked()) {
    return absl::FailedPreconditionError(
        "cannot capture the RNG resume state during a named-stream fork: the live generators "
        "hold the named stream, not the caller's state");
  }
  const DefaultGenerators& generators = streams.generators();
  LOCKSTEP_ASSIGN_OR_RETURN(RngSnapshot caller, RngSnapshot::Capture(generators));
  if (caller.cuda().has_value() && caller.cuda()->in_capture.has_value()) {
    return absl::FailedPreconditionError(
        "cannot capture the RNG resume state during CUDA graph capture: the CUDA generator's "
        "position there is graph-relative and only known at replay");
  }
  RngResumeStateProto proto;
  proto.set_version(kRngResumeStateVersion);
  proto.set_cuda_device(generators.cuda_device);
  *proto.mutable_caller() = ToProto(caller);
  if (streams.model().state().has_value())
    *proto.mutable_model() = ToProto(*streams.model().state());
  for (const auto& [name, stream] : streams.named().streams()) {
    NamedStreamProto* named = proto.add_named();
    named->set_name(name);
    named->set_seed(stream.seed);
    *named->mutable_state() = ToProto(stream.state);
  }
  return proto;
}

absl::StatusOr<CheckedResumeState> CheckedResumeState::Check(const RngResumeStateProto& saved,
                                                             RankStreams& streams) {
  LOCKSTEP_RETURN_IF_ERROR(CheckStructure(saved));
  LOCKSTEP_RETURN_IF_ERROR(streams.CheckGenerators(
      DefaultGenerators::WithCudaDevice(saved.cuda_device()),  // -1 (CPU only) compares as such
      "the RNG resume state"));
  if (!streams.caller_state_live()) {
    return absl::FailedPreconditionError(
        "cannot restore the RNG resume state inside a model-stream scope or named-stream fork");
  }
  LOCKSTEP_ASSIGN_OR_RETURN(RngSnapshot caller, FromProto(saved.caller(), streams, "caller state"));
  std::optional<RngSnapshot> model_state;
  if (saved.has_model()) {
    LOCKSTEP_ASSIGN_OR_RETURN(model_state, FromProto(saved.model(), streams, "model stream"));
  }
  std::map<std::string, NamedStreamTracker::Stream> named;
  std::map<uint64_t, std::string> seeds;
  for (const NamedStreamProto& stream : saved.named()) {
    LOCKSTEP_ASSIGN_OR_RETURN(
        RngSnapshot state,
        FromProto(stream.state(), streams, absl::StrCat("named stream '", stream.name(), "'")));
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
  return CheckedResumeState(streams.shared_from_this(), std::move(caller), std::move(model_state),
                            std::move(named));
}

absl::Status CheckedResumeState::Install() && {
  if (!streams_->caller_state_live()) {
    return absl::FailedPreconditionError(
        "cannot restore the RNG resume state inside a model-stream scope or named-stream fork");
  }
  // The live generators first: the only step that can still fail (it writes both generators or
  // neither). The model stream and named streams, validated by Check, then cannot fail.
  LOCKSTEP_RETURN_IF_ERROR(caller_.Restore());
  LOCKSTEP_RETURN_IF_ERROR(streams_->model().Restore(std::move(model_)));
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(streams_->named().Restore(std::move(named_)),
                                        "while restoring named streams");
  return absl::OkStatus();
}

absl::Status RestoreResumeState(const RngResumeStateProto& saved, RankStreams& streams) {
  LOCKSTEP_ASSIGN_OR_RETURN(CheckedResumeState checked, CheckedResumeState::Check(saved, streams));
  return std::move(checked).Install();
}

}  // namespace rng
}  // namespace lockstep
