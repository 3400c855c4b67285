#include "trainer/saved_state.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/core/grad_mode.h"
#include "absl/strings/str_cat.h"
#include "base/file_io.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "numerics/safetensors.h"
#include "rng/resume_state.h"
#include "torch/optim/optimizer.h"
#include "torch/serialize.h"

namespace lockstep {
namespace trainer {
namespace {

constexpr char kWeightsFile[] = "weights.safetensors";
constexpr char kOptimizerFile[] = "optimizer.pt";
constexpr char kRngFile[] = "rng.bin";
constexpr char kTrainerFile[] = "trainer.txt";

bool Exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, MappedFile::Open(path));
  std::string bytes(file->bytes());
  LOCKSTEP_RETURN_IF_ERROR(file->CheckUnchanged());
  return bytes;
}

// The optimizer's state as torch::save writes it, in memory.
absl::StatusOr<std::string> OptimizerBytes(const torch::optim::Optimizer& optimizer,
                                           absl::string_view what) {
  std::ostringstream bytes;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch(what, [&] {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    archive.save_to(bytes);
  }));
  return bytes.str();
}

// Loads `bytes` (torch::save's archive) into `optimizer`.
absl::Status LoadOptimizer(const std::string& bytes, torch::optim::Optimizer& optimizer,
                           absl::string_view what) {
  return CallTorch(what, [&] {
    std::istringstream in(bytes);
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    optimizer.load(archive);
  });
}

// The weights file's tensors. A file that is there but does not parse was damaged: kDataLoss.
absl::StatusOr<numerics::NamedTensors> ReadWeights(const std::string& path) {
  absl::StatusOr<numerics::NamedTensors> tensors = [&]() -> absl::StatusOr<numerics::NamedTensors> {
    LOCKSTEP_ASSIGN_OR_RETURN(numerics::SafetensorsFile file,
                              numerics::SafetensorsFile::Open(path));
    return file.Tensors();
  }();
  if (absl::IsInvalidArgument(tensors.status())) {
    return absl::DataLossError(absl::StrCat("damaged: ", tensors.status().message()));
  }
  return tensors;
}

// The saved weights matched to `weights` by name (kInvalidArgument naming a weight that is
// missing, extra or saved with another shape or dtype).
absl::StatusOr<std::vector<at::Tensor>> MatchWeights(const numerics::NamedTensors& saved,
                                                     const numerics::NamedTensors& weights,
                                                     const std::string& where) {
  if (saved.size() != weights.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", saved.size(), " saved weights for ", weights.size(), " given"));
  }
  std::vector<at::Tensor> sources;
  for (const auto& entry : weights) {
    const at::Tensor* source = nullptr;
    for (const auto& s : saved) {
      if (s.first == entry.first) source = &s.second;
    }
    if (source == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no saved weight named '", entry.first, "'"));
    }
    if (source->sizes() != entry.second.sizes() ||
        source->scalar_type() != entry.second.scalar_type()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": weight '", entry.first,
                                                     "' was saved with another shape or dtype"));
    }
    sources.push_back(*source);
  }
  return sources;
}

}  // namespace

void RemoveSavedState(const std::string& dir) {
  for (const char* name : {kWeightsFile, kOptimizerFile, kRngFile, kTrainerFile}) {
    std::remove(absl::StrCat(dir, "/", name).c_str());
  }
  rmdir(dir.c_str());
}

absl::Status SaveTrainingState(const std::string& dir, const rng::RankStreams& streams,
                               int64_t forward_index, const numerics::NamedTensors& weights,
                               const torch::optim::Optimizer* optimizer,
                               const SaveOptions& options) {
  if (!streams.caller_state_live()) {
    return absl::FailedPreconditionError("inside a model-stream scope or named-stream fork");
  }
  if (Exists(dir)) return absl::FailedPreconditionError("it exists; choose a new one");
  // Everything to write is known before the temporary directory exists.
  std::optional<std::string> optimizer_bytes;
  if (optimizer != nullptr) {
    LOCKSTEP_ASSIGN_OR_RETURN(optimizer_bytes, OptimizerBytes(*optimizer, "saving the optimizer"));
  }
  std::optional<std::string> rng_bytes;
  if (options.include_rng_streams) {
    LOCKSTEP_ASSIGN_OR_RETURN(rng::RngResumeStateProto rng, rng::CaptureResumeState(streams));
    LOCKSTEP_ASSIGN_OR_RETURN(rng_bytes, rng::SerializeResumeState(rng));
  }
  const std::string temp = absl::StrCat(dir, ".saving.", getpid());
  RemoveSavedState(temp);
  if (mkdir(temp.c_str(), 0755) != 0) {
    return absl::InternalError(absl::StrCat("mkdir ", temp, ": ", strerror(errno)));
  }
  absl::Status status = [&]() -> absl::Status {
    // Each write fsyncs its file (base/file_io.h).
    LOCKSTEP_RETURN_IF_ERROR(
        numerics::WriteSafetensors(absl::StrCat(temp, "/", kWeightsFile), weights, {}));
    if (optimizer_bytes.has_value()) {
      LOCKSTEP_RETURN_IF_ERROR(
          WriteFileAtomically(absl::StrCat(temp, "/", kOptimizerFile), *optimizer_bytes));
    }
    if (rng_bytes.has_value()) {
      LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(temp, "/", kRngFile), *rng_bytes));
    }
    LOCKSTEP_RETURN_IF_ERROR(
        WriteFileAtomically(absl::StrCat(temp, "/", kTrainerFile),
                            absl::StrCat("forward_index ", forward_index, "\n")));
    // The temporary's entries, then the rename and the parent's entry: only then is `dir` there
    // and complete after a power loss.
    LOCKSTEP_RETURN_IF_ERROR(SyncPath(temp));
    if (rename(temp.c_str(), dir.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("rename ", temp, " to ", dir, ": ", strerror(errno)));
    }
    return SyncParentDirectory(dir);
  }();
  if (!status.ok()) RemoveSavedState(temp);
  return status;
}

absl::StatusOr<LoadedState> LoadTrainingState(const std::string& dir, rng::RankStreams& streams,
                                              numerics::NamedTensors& weights,
                                              torch::optim::Optimizer* optimizer) {
  if (!streams.caller_state_live()) {
    return absl::FailedPreconditionError("inside a model-stream scope or named-stream fork");
  }
  LoadedState loaded;
  // 1. Read and check everything; nothing changes yet.
  LOCKSTEP_ASSIGN_OR_RETURN(numerics::NamedTensors saved,
                            ReadWeights(absl::StrCat(dir, "/", kWeightsFile)));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> sources, MatchWeights(saved, weights, dir));
  std::optional<rng::CheckedResumeState> rng_state;
  const std::string rng_path = absl::StrCat(dir, "/", kRngFile);
  if (Exists(rng_path)) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(rng_path));
    LOCKSTEP_ASSIGN_OR_RETURN(rng::RngResumeStateProto proto, rng::ParseResumeState(bytes));
    absl::StatusOr<rng::CheckedResumeState> checked =
        rng::CheckedResumeState::Check(proto, streams);
    if (!checked.ok()) return Annotate(checked.status(), absl::StrCat("checking ", rng_path));
    rng_state.emplace(std::move(*checked));
  }
  const std::string counters_path = absl::StrCat(dir, "/", kTrainerFile);
  LOCKSTEP_ASSIGN_OR_RETURN(std::string counters, ReadWholeFile(counters_path));
  if (std::sscanf(counters.c_str(), "forward_index %ld", &loaded.forward_index) != 1 ||
      loaded.forward_index < 0) {
    return absl::DataLossError(absl::StrCat(counters_path, " is damaged"));
  }
  const std::string optimizer_path = absl::StrCat(dir, "/", kOptimizerFile);
  std::optional<std::string> optimizer_bytes, optimizer_before;
  if (optimizer != nullptr && Exists(optimizer_path)) {
    LOCKSTEP_ASSIGN_OR_RETURN(optimizer_bytes, ReadWholeFile(optimizer_path));
    // The optimizer is checked by loading the archive into it, so its state before is kept to
    // put back if anything after fails.
    LOCKSTEP_ASSIGN_OR_RETURN(optimizer_before,
                              OptimizerBytes(*optimizer, "keeping the optimizer's state"));
  }
  std::vector<at::Tensor> weights_before;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("keeping the weights", [&] {
    for (const auto& entry : weights) weights_before.push_back(entry.second.detach().clone());
  }));

  // 2. Change: the optimizer (which checks its archive), the weights, then the RNG streams (which
  // can only fail if the live generators refuse a state they were checked to accept).
  auto put_back = [&] {
    if (optimizer_before.has_value()) {
      // Cleared first: loading the old archive assigns only the state it holds, so state the
      // refused load gave a parameter that had none would otherwise stay.
      CallTorch("clearing the optimizer's state", [&] {
        optimizer->state().clear();
      }).IgnoreError();
      LoadOptimizer(*optimizer_before, *optimizer, "putting the optimizer back").IgnoreError();
    }
    CallTorch("putting the weights back", [&] {
      at::AutoGradMode no_grad(false);
      for (size_t i = 0; i < weights.size(); ++i) weights[i].second.copy_(weights_before[i]);
    }).IgnoreError();
  };
  if (optimizer_bytes.has_value()) {
    absl::Status status = LoadOptimizer(*optimizer_bytes, *optimizer, "loading the optimizer");
    if (!status.ok()) {
      put_back();
      return absl::DataLossError(absl::StrCat(optimizer_path,
                                              " is damaged or of another optimizer (nothing was "
                                              "changed): ",
                                              status.message()));
    }
    loaded.report.optimizer = true;
  }
  absl::Status status = CallTorch("copying the weights", [&] {
    at::AutoGradMode no_grad(false);
    for (size_t i = 0; i < weights.size(); ++i) {
      weights[i].second.copy_(sources[i].to(weights[i].second.device()));
    }
  });
  if (status.ok() && rng_state.has_value()) status = std::move(*rng_state).Install();
  if (!status.ok()) {
    put_back();
    return status;
  }
  loaded.report.weights = static_cast<int>(weights.size());
  loaded.report.rng_streams = rng_state.has_value();
  return loaded;
}

}  // namespace trainer
}  // namespace lockstep
