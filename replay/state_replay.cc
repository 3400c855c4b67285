#include "replay/state_replay.h"

#include <sys/stat.h>

#include <algorithm>
#include <map>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file_io.h"
#include "base/json.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "numerics/execution_context.h"
#include "replay/state_capture.h"

namespace lockstep {
namespace replay {
namespace {

// Larger index or completion files than any capture writes are not read.
constexpr size_t kMaxJsonBytes = size_t{64} << 20;

std::string Sha256Hex(absl::string_view bytes) {
  Sha256Hasher hasher;
  hasher.Append(bytes);
  return DigestHex(hasher.Finish());
}

// Note [A capture against its place]: nothing a capture says about itself is trusted. It is read
// only from regular files reached through no link of its own run's folders (a run whose step or
// rank folders link to another run's captures would be compared with that run), its state file's
// header is checked before its bytes are hashed (a sparse file of gigabytes is refused at once,
// not hashed), and its index must name the step and rank of the folders it sits in, the world size
// its run declared and this format, every field read with its type checked. A relabelled rank,
// another run's capture, an index of another format, or a two-rank run read as one rank is
// refused as evidence that cannot decide, never compared.

// kInvalidArgument when `path` is a symbolic link; OK when it is anything else or is missing
// (a missing file is named by whoever reads it).
absl::Status RefuseLink(const std::string& path) {
  struct stat info;
  if (::lstat(path.c_str(), &info) == 0 && S_ISLNK(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is a symbolic link: a capture is read only from its own run's files"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadCaptureFile(const std::string& path, size_t max_bytes) {
  LOCKSTEP_RETURN_IF_ERROR(RefuseLink(path));
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    return absl::NotFoundError(absl::StrCat(path, " is missing"));
  }
  return ReadFileToString(path, max_bytes);
}

// `value`, or its error as kDataLoss: a capture file that cannot be read or parsed is damaged.
template <typename T>
absl::StatusOr<T> Damaged(absl::StatusOr<T> value) {
  if (value.ok()) return value;
  return absl::DataLossError(value.status().message());
}

// The value of element `index` of `entry`, printed.
std::string ElementValue(const numerics::SafetensorsEntry& entry, int64_t index) {
  const size_t size = at::elementSize(entry.dtype);
  std::string out = "?";
  (void)CallTorch("printing an element", [&] {
    at::Tensor element = at::empty({1}, at::TensorOptions().dtype(entry.dtype));
    std::memcpy(element.data_ptr(), entry.bytes.data() + index * size, size);
    out = absl::StrFormat("%.9g", element.to(at::kDouble).item<double>());
  });
  return out;
}

// The first byte where `a` and `b` (equal forms) differ, filling `d`; false when equal.
bool CompareBytes(const numerics::SafetensorsEntry& a, const numerics::SafetensorsEntry& b,
                  CaptureDifference& d) {
  if (a.bytes == b.bytes) return false;
  const size_t size = at::elementSize(a.dtype);
  const auto mismatch = std::mismatch(a.bytes.begin(), a.bytes.end(), b.bytes.begin());
  d.kind = "bytes";
  d.byte_offset = mismatch.first - a.bytes.begin();
  d.element_index = d.byte_offset / static_cast<int64_t>(size);
  d.elements = static_cast<int64_t>(a.bytes.size() / size);
  for (size_t i = 0; i < a.bytes.size(); i += size) {
    if (a.bytes.compare(i, size, b.bytes, i, size) != 0) ++d.differing_elements;
  }
  d.a_value = ElementValue(a, d.element_index);
  d.b_value = ElementValue(b, d.element_index);
  return true;
}

// The kind of difference at one path ("" when equal), filling `d` for the first.
std::string ComparePath(const numerics::SafetensorsEntry* a, const numerics::SafetensorsEntry* b,
                        CaptureDifference* d) {
  CaptureDifference scratch;
  CaptureDifference& out = d != nullptr ? *d : scratch;
  if (a == nullptr) return out.kind = "only_in_b";
  if (b == nullptr) return out.kind = "only_in_a";
  if (a->dtype != b->dtype) return out.kind = "dtype";
  if (a->shape != b->shape) return out.kind = "shape";
  return CompareBytes(*a, *b, out) ? out.kind : "";
}

// `value` of `what`'s `key` against what its place says it must be.
absl::Status Expect(absl::string_view what, absl::string_view key, int64_t value, int64_t expected,
                    absl::string_view whence) {
  if (value == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " says ", key, " ", value, ", but ", whence,
                                                 " says ", expected,
                                                 " (Note [A capture against its place])"));
}

// Checks the fields of a parsed index.json against `place` and keeps those the comparison reads.
absl::Status CheckIndex(const std::string& what, const CapturePlace& place,
                        const nlohmann::json& index, nlohmann::json* context_out,
                        std::vector<bool>* present_out) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::string format, JsonString(index, "format", what));
  if (format != kStateCaptureFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is an index of format '", format, "', not ", kStateCaptureFormat));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(int64_t step, JsonInt(index, "step", what));
  LOCKSTEP_RETURN_IF_ERROR(Expect(what, "step", step, place.step, "its folder"));
  LOCKSTEP_ASSIGN_OR_RETURN(int64_t rank, JsonInt(index, "rank", what));
  LOCKSTEP_RETURN_IF_ERROR(Expect(what, "rank", rank, place.rank, "its folder"));
  LOCKSTEP_ASSIGN_OR_RETURN(int64_t world, JsonInt(index, "world_size", what));
  LOCKSTEP_RETURN_IF_ERROR(Expect(what, "world_size", world, place.world_size, "the run"));
  LOCKSTEP_ASSIGN_OR_RETURN(const nlohmann::json* context, JsonObject(index, "context", what));
  *context_out = *context;
  LOCKSTEP_ASSIGN_OR_RETURN(const nlohmann::json* components,
                            JsonObject(index, "components", what));
  for (const char* name : kCaptureComponents) {
    LOCKSTEP_ASSIGN_OR_RETURN(const nlohmann::json* component,
                              JsonObject(*components, name, absl::StrCat(what, "'s components")));
    LOCKSTEP_ASSIGN_OR_RETURN(
        bool present, JsonBool(*component, "present", absl::StrCat(what, "'s component ", name)));
    present_out->push_back(present);
  }
  LOCKSTEP_ASSIGN_OR_RETURN(const nlohmann::json* paths, JsonArray(index, "paths", what));
  for (const nlohmann::json& path : *paths) {
    if (!path.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": a member of \"paths\" is ", path.type_name(), ", not a string"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoadedCapture> LoadStateCapture(const std::string& dir, const CapturePlace& place) {
  LOCKSTEP_RETURN_IF_ERROR(RefuseLink(ParentDirectory(dir)));
  LOCKSTEP_RETURN_IF_ERROR(RefuseLink(dir));
  LOCKSTEP_RETURN_IF_ERROR(RefuseLink(absl::StrCat(dir, "/complete.json")));
  absl::StatusOr<std::string> complete_text =
      ReadCaptureFile(absl::StrCat(dir, "/complete.json"), kMaxJsonBytes);
  if (!complete_text.ok()) {
    return absl::DataLossError(absl::StrCat("capture ", dir, " is partial (its rank did not ",
                                            "complete): ", complete_text.status().message()));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(
      nlohmann::json complete,
      Damaged(ParseJson(*complete_text, absl::StrCat(dir, "/complete.json"))));
  LOCKSTEP_ASSIGN_OR_RETURN(std::string format,
                            Damaged(JsonString(complete, "format", "complete.json")));
  if (format != kStateCaptureFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, " is a capture of format '", format, "', not ", kStateCaptureFormat));
  }
  const std::string complete_what = absl::StrCat(dir, "/complete.json");
  for (const auto& [key, expected] :
       {std::make_pair("step", place.step), std::make_pair("rank", int64_t{place.rank})}) {
    LOCKSTEP_ASSIGN_OR_RETURN(int64_t value, JsonInt(complete, key, complete_what));
    LOCKSTEP_RETURN_IF_ERROR(Expect(complete_what, key, value, expected, "its folder"));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::string index_text,
      Damaged(ReadCaptureFile(absl::StrCat(dir, "/index.json"), kMaxJsonBytes)));
  const std::string state_path = absl::StrCat(dir, "/state.safetensors");
  LOCKSTEP_RETURN_IF_ERROR(RefuseLink(state_path));
  // The header first: a file that is no safetensors file is refused before its bytes are hashed.
  LOCKSTEP_ASSIGN_OR_RETURN(numerics::SafetensorsFile state,
                            Damaged(numerics::SafetensorsFile::Open(state_path)));
  // The state is hashed from the mapping its entries are compared from: a file replaced between
  // two opens cannot be compared unhashed.
  for (const auto& [key, bytes, what] :
       {std::make_tuple("index_sha256", absl::string_view(index_text), "index.json"),
        std::make_tuple("state_sha256", state.bytes(), "state.safetensors")}) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string expected,
                              Damaged(JsonString(complete, key, "complete.json")));
    if (Sha256Hex(bytes) != expected) {
      return absl::DataLossError(absl::StrCat(dir, "/", what,
                                              " does not hash to what complete.json says (damaged, "
                                              "truncated or written by another capture)"));
    }
  }
  LOCKSTEP_RETURN_IF_ERROR(state.CheckUnchanged());
  const std::string index_what = absl::StrCat(dir, "/index.json");
  LOCKSTEP_ASSIGN_OR_RETURN(nlohmann::json index, Damaged(ParseJson(index_text, index_what)));
  nlohmann::json context;
  std::vector<bool> present;
  LOCKSTEP_RETURN_IF_ERROR(CheckIndex(index_what, place, index, &context, &present));
  return LoadedCapture{
      dir, place, std::move(context), std::move(present), std::move(index), std::move(state)};
}

absl::StatusOr<std::optional<CaptureDifference>> CompareCaptures(const LoadedCapture& a,
                                                                 const LoadedCapture& b) {
  const std::vector<std::string> differences = numerics::ContextDifferences(a.context, b.context);
  if (!differences.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("captures ", a.dir, " and ", b.dir,
                     " come from incompatible runs: their execution contexts differ in ",
                     absl::StrJoin(differences, ", ")));
  }
  CaptureDifference d;
  d.step = a.place.step;
  d.rank = a.place.rank;
  for (size_t i = 0; i < a.present.size() && i < b.present.size(); ++i) {
    if (a.present[i] != b.present[i]) {
      d.differing_paths.push_back(kCaptureComponents[i]);
      if (d.kind.empty()) {
        d.kind = "components";
        d.path = kCaptureComponents[i];
      }
    }
  }
  // Paths in capture order: a's, then those only b has.
  std::vector<std::string> paths;
  for (const auto& entry : a.state.entries()) paths.push_back(entry.name);
  for (const auto& entry : b.state.entries()) {
    if (a.state.Find(entry.name) == nullptr) paths.push_back(entry.name);
  }
  for (const std::string& path : paths) {
    const bool first = d.kind.empty();
    const std::string kind =
        ComparePath(a.state.Find(path), b.state.Find(path), first ? &d : nullptr);
    if (kind.empty()) continue;
    if (first) d.path = path;
    d.differing_paths.push_back(path);
  }
  LOCKSTEP_RETURN_IF_ERROR(a.state.CheckUnchanged());
  LOCKSTEP_RETURN_IF_ERROR(b.state.CheckUnchanged());
  if (d.kind.empty()) return std::nullopt;
  return d;
}

absl::StatusOr<RunComparison> CompareRuns(const std::string& a_root, const std::string& b_root,
                                          int64_t first_step, int64_t last_step, int world_size) {
  if (first_step > last_step || first_step < 0 || world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("no captures to compare: steps [", first_step,
                                                   ", ", last_step, "], world size ", world_size));
  }
  RunComparison out;
  out.first_step = first_step;
  out.last_step = last_step;
  for (int64_t step = first_step; step <= last_step && !out.first.has_value(); ++step) {
    for (int rank = 0; rank < world_size; ++rank) {
      const CapturePlace place{step, rank, world_size};
      LOCKSTEP_ASSIGN_OR_RETURN(LoadedCapture a,
                                LoadStateCapture(CaptureDirectory(a_root, step, rank), place));
      LOCKSTEP_ASSIGN_OR_RETURN(LoadedCapture b,
                                LoadStateCapture(CaptureDirectory(b_root, step, rank), place));
      LOCKSTEP_ASSIGN_OR_RETURN(std::optional<CaptureDifference> d, CompareCaptures(a, b));
      ++out.captures;
      if (d.has_value() && !out.first.has_value()) out.first = std::move(d);
    }
  }
  return out;
}

nlohmann::json CaptureDifferenceJson(const CaptureDifference& d) {
  return {{"step", d.step},
          {"rank", d.rank},
          {"path", d.path},
          {"kind", d.kind},
          {"byte_offset", d.byte_offset},
          {"element_index", d.element_index},
          {"differing_elements", d.differing_elements},
          {"elements", d.elements},
          {"a", d.a_value},
          {"b", d.b_value},
          {"differing_paths", d.differing_paths}};
}

}  // namespace replay
}  // namespace lockstep
