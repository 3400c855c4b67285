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

absl::StatusOr<std::string> ReadCaptureFile(const std::string& path, size_t max_bytes) {
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

}  // namespace

absl::StatusOr<LoadedCapture> LoadStateCapture(const std::string& dir) {
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
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::string index_text,
      Damaged(ReadCaptureFile(absl::StrCat(dir, "/index.json"), kMaxJsonBytes)));
  const std::string state_path = absl::StrCat(dir, "/state.safetensors");
  LOCKSTEP_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> mapped,
                            Damaged(MappedFile::Open(state_path)));
  for (const auto& [key, bytes, what] :
       {std::make_tuple("index_sha256", absl::string_view(index_text), "index.json"),
        std::make_tuple("state_sha256", mapped->bytes(), "state.safetensors")}) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string expected,
                              Damaged(JsonString(complete, key, "complete.json")));
    if (Sha256Hex(bytes) != expected) {
      return absl::DataLossError(absl::StrCat(dir, "/", what,
                                              " does not hash to what complete.json says (damaged, "
                                              "truncated or written by another capture)"));
    }
  }
  LOCKSTEP_ASSIGN_OR_RETURN(nlohmann::json index,
                            Damaged(ParseJson(index_text, absl::StrCat(dir, "/index.json"))));
  for (const char* key : {"step", "rank"}) {
    LOCKSTEP_ASSIGN_OR_RETURN(int64_t in_index, Damaged(JsonInt(index, key, "index.json")));
    LOCKSTEP_ASSIGN_OR_RETURN(int64_t in_record, Damaged(JsonInt(complete, key, "complete.json")));
    if (in_index != in_record) {
      return absl::DataLossError(absl::StrCat(dir, ": index.json and complete.json disagree on ",
                                              key, " (", in_index, " vs ", in_record, ")"));
    }
  }
  LOCKSTEP_ASSIGN_OR_RETURN(numerics::SafetensorsFile state,
                            Damaged(numerics::SafetensorsFile::Open(state_path)));
  return LoadedCapture{dir, std::move(index), std::move(state)};
}

absl::StatusOr<std::optional<CaptureDifference>> CompareCaptures(const LoadedCapture& a,
                                                                 const LoadedCapture& b) {
  const std::vector<std::string> differences =
      numerics::ContextDifferences(a.index.value("context", nlohmann::json::object()),
                                   b.index.value("context", nlohmann::json::object()));
  if (!differences.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("captures ", a.dir, " and ", b.dir,
                     " come from incompatible runs: their execution contexts differ in ",
                     absl::StrJoin(differences, ", ")));
  }
  CaptureDifference d;
  d.step = a.index.value("step", int64_t{0});
  d.rank = a.index.value("rank", 0);
  const nlohmann::json& ca = a.index["components"];
  const nlohmann::json& cb = b.index["components"];
  for (const char* name : kCaptureComponents) {
    if (ca.value(name, nlohmann::json::object()).value("present", false) !=
        cb.value(name, nlohmann::json::object()).value("present", false)) {
      d.differing_paths.push_back(name);
      if (d.kind.empty()) {
        d.kind = "components";
        d.path = name;
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
      LOCKSTEP_ASSIGN_OR_RETURN(LoadedCapture a,
                                LoadStateCapture(CaptureDirectory(a_root, step, rank)));
      LOCKSTEP_ASSIGN_OR_RETURN(LoadedCapture b,
                                LoadStateCapture(CaptureDirectory(b_root, step, rank)));
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
