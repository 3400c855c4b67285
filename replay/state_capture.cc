#include "replay/state_capture.h"

#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/file_io.h"
#include "base/json.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "nlohmann/json.hpp"
#include "numerics/execution_context.h"
#include "numerics/module_state.h"
#include "numerics/safetensors.h"
#include "rng/resume_state.h"

namespace lockstep {
namespace replay {
namespace {

at::Tensor Int64s(std::vector<int64_t> values) { return at::tensor(values, at::kLong); }

at::Tensor Bytes(const std::string& bytes) {
  at::Tensor out = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  if (!bytes.empty()) std::memcpy(out.data_ptr(), bytes.data(), bytes.size());
  return out;
}

// The SHA-256 of the concatenation of `pieces`, in hex.
std::string Sha256Hex(absl::Span<const absl::string_view> pieces) {
  Sha256Hasher hasher;
  for (absl::string_view piece : pieces) hasher.Append(piece);
  return DigestHex(hasher.Finish());
}

// One generator set's tensors under `prefix` ("rng/caller").
void AddGeneratorSet(const std::string& prefix, const rng::GeneratorSetProto& set,
                     numerics::NamedTensors& out) {
  out.emplace_back(absl::StrCat(prefix, "/cpu"), Bytes(set.cpu_state()));
  if (set.has_cuda()) {
    out.emplace_back(absl::StrCat(prefix, "/cuda"),
                     Int64s({static_cast<int64_t>(set.cuda().seed()),
                             static_cast<int64_t>(set.cuda().offset())}));
  }
}

absl::Status AddRng(const rng::RankStreams& streams, numerics::NamedTensors& out) {
  LOCKSTEP_ASSIGN_OR_RETURN(rng::RngResumeStateProto state, rng::CaptureResumeState(streams));
  return CallTorch("capturing the RNG streams", [&] {
    AddGeneratorSet("rng/caller", state.caller(), out);
    if (state.has_model()) AddGeneratorSet("rng/model", state.model(), out);
    for (const rng::NamedStreamProto& named : state.named()) {
      const std::string prefix = absl::StrCat("rng/named/", named.name());
      out.emplace_back(absl::StrCat(prefix, "/seed"), Int64s({static_cast<int64_t>(named.seed())}));
      AddGeneratorSet(prefix, named.state(), out);
    }
  });
}

// Which components are given, checked against the declared absences.
absl::StatusOr<nlohmann::json> Components(const CaptureComponents& c) {
  const std::map<std::string, bool> given = {
      {"data", c.data_position.has_value()},
      {"ledger", c.ledger_step.has_value()},
      {"rng", c.streams != nullptr},
      {"optimizer", c.optimizer != nullptr || !c.optimizer_state.empty()},
      {"weights", !c.weights.empty()},
      {"gradients", !c.weights.empty()}};
  for (const auto& [name, reason] : c.absent) {
    if (given.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("absent component '", name,
                       "' is not a capture component (data, ledger, rng, optimizer, weights, "
                       "gradients)"));
    }
  }
  if (c.optimizer != nullptr && !c.optimizer_state.empty()) {
    return absl::InvalidArgumentError(
        "the optimizer is given twice: as a torch::optim::Optimizer and as optimizer_state");
  }
  nlohmann::json out = nlohmann::json::object();
  for (const char* name : kCaptureComponents) {
    const auto reason = c.absent.find(name);
    if (given.at(name)) {
      if (reason != c.absent.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "component '", name, "' is given and also declared absent ('", reason->second, "')"));
      }
      out[name] = {{"present", true}};
    } else {
      if (reason == c.absent.end() || reason->second.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("component '", name,
                         "' is missing without a reason: give it, or declare it in "
                         "CaptureComponents::absent with why this program has none"));
      }
      out[name] = {{"present", false}, {"reason", reason->second}};
    }
  }
  return out;
}

// The program's own generators: each given or declared absent with a reason, never both.
absl::StatusOr<nlohmann::json> ProgramRng(const CaptureComponents& c) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, tensor] : c.program_rng) {
    if (name.empty() || out.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("program generator name '", name, "' is empty or given twice"));
    }
    if (c.program_rng_absent.count(name) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("program generator '", name, "' is given and also declared absent"));
    }
    out[name] = {{"present", true}};
  }
  for (const auto& [name, reason] : c.program_rng_absent) {
    if (reason.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("program generator '", name, "' is declared absent without a reason"));
    }
    out[name] = {{"present", false}, {"reason", reason}};
  }
  return out;
}

}  // namespace

std::string CaptureDirectory(const std::string& root, int64_t step, int rank) {
  return absl::StrCat(root, "/step", step, "/rank", rank);
}

// Note [Capture at the disk's rate]
// A capture's cost is held to the time the disk takes to write its bytes: the tensors are written
// from where they lie (SafetensorsPieces: no copy into one buffer), and the state's SHA-256, which
// complete.json records, is computed on a second thread while the file is written and fsynced, so
// the two overlap instead of adding up. The directory is fsynced once, after complete.json (the
// marker) is renamed into place: that makes all three names durable.
absl::Status WriteStateCapture(const std::string& root, int64_t step, int rank, int world_size,
                               const CaptureComponents& c) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("capture step ", step, " < 0"));
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("capture rank ", rank, " is outside [0, ", world_size, ")"));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(nlohmann::json components, Components(c));
  LOCKSTEP_ASSIGN_OR_RETURN(nlohmann::json program_rng, ProgramRng(c));
  numerics::NamedTensors tensors;
  nlohmann::json no_gradient = nlohmann::json::array();
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("capturing the step's state", [&] {
    if (c.data_position.has_value())
      tensors.emplace_back("data/position", Int64s({*c.data_position}));
    if (c.ledger_step.has_value()) {
      tensors.emplace_back("ledger/committed_step", Int64s({*c.ledger_step}));
    }
  }));
  if (c.streams != nullptr) LOCKSTEP_RETURN_IF_ERROR(AddRng(*c.streams, tensors));
  if (c.optimizer != nullptr) {
    LOCKSTEP_ASSIGN_OR_RETURN(numerics::NamedTensors optimizer,
                              numerics::OptimizerState(c.weights, *c.optimizer));
    for (auto& entry : optimizer) tensors.push_back(std::move(entry));
  }
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("capturing the program's generators and optimizer", [&] {
    for (const auto& [name, tensor] : c.program_rng) {
      tensors.emplace_back(absl::StrCat("rng/program/", name), tensor.detach());
    }
    for (const auto& [name, tensor] : c.optimizer_state) {
      tensors.emplace_back(absl::StrCat("optimizer/", name), tensor.detach());
    }
  }));
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("capturing the weights and gradients", [&] {
    for (const auto& [name, tensor] : c.weights) {
      tensors.emplace_back(absl::StrCat("weights/", name), tensor.detach());
    }
    for (const auto& [name, tensor] : c.weights) {
      if (tensor.grad().defined()) {
        tensors.emplace_back(absl::StrCat("gradients/", name), tensor.grad().detach());
      } else {
        no_gradient.push_back(name);
      }
    }
  }));

  const std::string dir = CaptureDirectory(root, step, rank);
  std::error_code error;
  if (std::filesystem::exists(dir, error)) {
    return absl::AlreadyExistsError(
        absl::StrCat("capture directory ", dir, " exists: captures are never overwritten"));
  }
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat("creating ", dir, ": ", error.message()));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(numerics::SafetensorsPieces state,
                            numerics::SafetensorsPieces::Make(tensors));
  const std::vector<absl::string_view> state_pieces = state.pieces();
  nlohmann::json paths = nlohmann::json::array();
  for (const auto& entry : tensors) paths.push_back(entry.first);
  const nlohmann::json index = {{"format", kStateCaptureFormat},
                                {"step", step},
                                {"rank", rank},
                                {"world_size", world_size},
                                {"paths", paths},
                                {"components", components},
                                {"program_rng", program_rng},
                                {"no_gradient", no_gradient},
                                {"context", numerics::CaptureExecutionContext()}};
  const std::string index_text = DumpJson(index, 1);
  // The state's hash is taken while it is written (Note [Capture at the disk's rate]).
  std::string state_sha256;
  std::thread hashing([&state_pieces, &state_sha256] { state_sha256 = Sha256Hex(state_pieces); });
  WriteOptions before_marker;
  before_marker.sync_directory = false;  // complete.json's directory fsync covers these names
  absl::Status written =
      WriteFileAtomically(absl::StrCat(dir, "/state.safetensors"), state_pieces, before_marker);
  if (written.ok()) {
    written = WriteFileAtomically(absl::StrCat(dir, "/index.json"), index_text, before_marker);
  }
  hashing.join();
  LOCKSTEP_RETURN_IF_ERROR(written);
  const nlohmann::json complete = {{"format", kStateCaptureFormat},
                                   {"step", step},
                                   {"rank", rank},
                                   {"state_sha256", state_sha256},
                                   {"index_sha256", Sha256Hex({index_text})}};
  return WriteFileAtomically(absl::StrCat(dir, "/complete.json"), DumpJson(complete, 1));
}

}  // namespace replay
}  // namespace lockstep
