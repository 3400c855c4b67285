// numerics/op_recording.cc: the operator recording's format (op_recording.h).

#include "numerics/op_recording.h"

#include <cerrno>
#include <cmath>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_io.h"
#include "base/json.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace lockstep {
namespace numerics {

using json = nlohmann::json;

std::vector<int64_t> DigestedShape(const OperatorValue& v) {
  std::vector<int64_t> shape = v.shape;
  for (int dim : v.window_dims) {
    if (dim >= 0 && dim < static_cast<int>(shape.size()))
      shape[dim] = v.window_end - v.window_begin;
  }
  return shape;
}

// Note [Operator digests]
// A side's digest is XXH3-128 over each value in order: its argument and item position, kind,
// dtype and shape as digested (a window's extent, wherever the window sits: one sequence alone
// and packed among others compare), then the 16 bytes of its tensor digest (kind "tensor") or its
// text (a scalar by value, another value's type name). Two calls' inputs (or outputs) match when
// their digests do; the values' structure is also compared, so a report can say which.
// Uninitialized contents (aten::empty's output, until some call took that storage) and out=
// arguments (written by the call, not read) are structure only: a caching allocator hands out
// memory holding whatever was there.
Digest128 OperatorSideDigest(const std::vector<OperatorValue>& values,
                             const std::vector<Digest128>& tensor_digests) {
  std::string bytes;
  auto field = [&bytes](absl::string_view s) { absl::StrAppend(&bytes, s.size(), ":", s, ";"); };
  for (size_t i = 0; i < values.size(); ++i) {
    const OperatorValue& v = values[i];
    field(absl::StrCat(v.arg, ",", v.item));
    field(v.kind);
    field(v.dtype);
    field(absl::StrJoin(DigestedShape(v), ","));
    if (v.kind == "tensor") {
      field(absl::string_view(reinterpret_cast<const char*>(tensor_digests[i].data()), 16));
    } else {
      field(v.value);
    }
  }
  return Xxh3Digest(bytes);
}

namespace {

json ValueJson(const OperatorValue& v, bool is_output) {
  json j = {{"arg", v.arg}, {"kind", v.kind}};
  if (v.item >= 0) j["item"] = v.item;
  if (!v.dtype.empty()) j["dtype"] = v.dtype;
  if (v.kind == "tensor" || v.kind == "uninitialized" || v.kind == "opaque") j["shape"] = v.shape;
  if (!v.window_dims.empty()) {
    j["window"] = {v.window_begin, v.window_end};
    j["window_dims"] = v.window_dims;
  }
  if (!v.value.empty()) j["value"] = v.value;
  if (is_output && v.kind == "tensor") {
    j["sum"] = JsonFigure(v.sum);
    j["max_abs"] = JsonFigure(v.max_abs);
  }
  return j;
}

absl::StatusOr<OperatorValue> ValueFromJson(const json& j) {
  OperatorValue v;
  if (!j.is_object() || !j.contains("arg") || !j["arg"].is_number_integer() ||
      !j.contains("kind") || !j["kind"].is_string()) {
    return absl::InvalidArgumentError("a value needs an integer 'arg' and a string 'kind'");
  }
  v.arg = j["arg"].get<int>();
  v.kind = j["kind"].get<std::string>();
  if (j.contains("item")) {
    if (!j["item"].is_number_integer()) return absl::InvalidArgumentError("'item' not an integer");
    v.item = j["item"].get<int>();
  }
  if (j.contains("dtype")) {
    if (!j["dtype"].is_string()) return absl::InvalidArgumentError("'dtype' not a string");
    v.dtype = j["dtype"].get<std::string>();
  }
  // Only the kinds whose shape the writer writes may carry one, or a window over it: anything
  // else would read here and not be written back (ValueJson).
  const bool shaped = v.kind == "tensor" || v.kind == "uninitialized" || v.kind == "opaque";
  if (!shaped && (j.contains("shape") || j.contains("window"))) {
    return absl::InvalidArgumentError(
        absl::StrCat("a value of kind '", v.kind, "' has a 'shape' or 'window'"));
  }
  if (j.contains("shape")) {
    if (!j["shape"].is_array()) return absl::InvalidArgumentError("'shape' not an array");
    for (const json& d : j["shape"]) {
      if (!d.is_number_integer()) return absl::InvalidArgumentError("'shape' not integers");
      v.shape.push_back(d.get<int64_t>());
    }
  }
  if (j.contains("window")) {
    const json& w = j["window"];
    if (!w.is_array() || w.size() != 2 || !w[0].is_number_integer() || !w[1].is_number_integer()) {
      return absl::InvalidArgumentError("'window' not two integers");
    }
    v.window_begin = w[0].get<int64_t>();
    v.window_end = w[1].get<int64_t>();
    if (!j.contains("window_dims") || !j["window_dims"].is_array() || j["window_dims"].empty()) {
      return absl::InvalidArgumentError("a 'window' needs its 'window_dims'");
    }
    for (const json& d : j["window_dims"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 ||
          d.get<int64_t>() >= static_cast<int64_t>(v.shape.size())) {
        return absl::InvalidArgumentError("'window_dims' not dimensions of 'shape'");
      }
      v.window_dims.push_back(d.get<int>());
    }
  }
  if (j.contains("value")) {
    if (!j["value"].is_string()) return absl::InvalidArgumentError("'value' not a string");
    v.value = j["value"].get<std::string>();
  }
  if (j.contains("sum")) v.sum = FigureFromJson(j["sum"]);
  if (j.contains("max_abs")) v.max_abs = FigureFromJson(j["max_abs"]);
  return v;
}

absl::StatusOr<Digest128> DigestFromHex(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("no string '", key, "'"));
  }
  const std::string hex = j[key].get<std::string>();
  const std::string bytes = absl::HexStringToBytes(hex);
  if (hex.size() != 32 || bytes.size() != 16 || absl::BytesToHexString(bytes) != hex) {
    return absl::InvalidArgumentError(absl::StrCat("'", key, "' is not 32 hex digits"));
  }
  Digest128 d;
  std::copy(bytes.begin(), bytes.end(), d.begin());
  return d;
}

absl::StatusOr<OperatorRecord> RecordFromJson(const json& j) {
  OperatorRecord r;
  if (!j.is_object() || !j.contains("index") || !j["index"].is_number_integer() ||
      !j.contains("op") || !j["op"].is_string() || !j.contains("module") ||
      !j["module"].is_string() || !j.contains("inputs") || !j["inputs"].is_array() ||
      !j.contains("outputs") || !j["outputs"].is_array()) {
    return absl::InvalidArgumentError(
        "a record needs 'index', 'op', 'module', 'inputs' and 'outputs'");
  }
  r.index = j["index"].get<int64_t>();
  r.op = j["op"].get<std::string>();
  r.module = j["module"].get<std::string>();
  if (j.contains("parent") && j["parent"].is_number_integer())
    r.parent = j["parent"].get<int64_t>();
  if (j.contains("depth") && j["depth"].is_number_integer()) r.depth = j["depth"].get<int>();
  for (const char* side : {"inputs", "outputs"}) {
    for (const json& v : j[side]) {
      absl::StatusOr<OperatorValue> value = ValueFromJson(v);
      if (!value.ok()) return Annotate(value.status(), absl::StrCat("in '", side, "'"));
      (std::string(side) == "inputs" ? r.inputs : r.outputs).push_back(*std::move(value));
    }
  }
  LOCKSTEP_ASSIGN_OR_RETURN(r.inputs_digest, DigestFromHex(j, "inputs_digest"));
  LOCKSTEP_ASSIGN_OR_RETURN(r.outputs_digest, DigestFromHex(j, "outputs_digest"));
  return r;
}

}  // namespace

json OperatorRecordJson(const OperatorRecord& r) {
  json inputs = json::array(), outputs = json::array();
  for (const OperatorValue& v : r.inputs) inputs.push_back(ValueJson(v, false));
  for (const OperatorValue& v : r.outputs) outputs.push_back(ValueJson(v, true));
  return {{"index", r.index},
          {"op", r.op},
          {"module", r.module},
          {"parent", r.parent},
          {"depth", r.depth},
          {"inputs", std::move(inputs)},
          {"outputs", std::move(outputs)},
          {"inputs_digest", DigestHex128(r.inputs_digest)},
          {"outputs_digest", DigestHex128(r.outputs_digest)}};
}

// Note [Record lines]
// The recorder writes a line per operator call; building the nlohmann value for it (a map per
// value, a string per key) cost more than the call itself. AppendOperatorRecordLine writes the
// same text straight: keys in the order nlohmann's map sorts them, no spaces, numbers and every
// string that needs escaping through nlohmann and DumpJson, as the value's dump would write
// them. op_recording_test checks the two agree, on every field and on strings to be escaped.
namespace {

template <typename T>
void AppendInts(const std::vector<T>& values, std::string* line) {
  absl::StrAppend(line, "[", absl::StrJoin(values, ","), "]");
}

void AppendValueLine(const OperatorValue& v, bool is_output, std::string* line) {
  absl::StrAppend(line, "{\"arg\":", v.arg);
  if (!v.dtype.empty()) {
    line->append(",\"dtype\":");
    AppendJsonString(v.dtype, line);
  }
  if (v.item >= 0) absl::StrAppend(line, ",\"item\":", v.item);
  line->append(",\"kind\":");
  AppendJsonString(v.kind, line);
  const bool figures = is_output && v.kind == "tensor";
  if (figures) absl::StrAppend(line, ",\"max_abs\":", DumpJson(JsonFigure(v.max_abs)));
  if (v.kind == "tensor" || v.kind == "uninitialized" || v.kind == "opaque") {
    line->append(",\"shape\":");
    AppendInts(v.shape, line);
  }
  if (figures) absl::StrAppend(line, ",\"sum\":", DumpJson(JsonFigure(v.sum)));
  if (!v.value.empty()) {
    line->append(",\"value\":");
    AppendJsonString(v.value, line);
  }
  if (!v.window_dims.empty()) {
    absl::StrAppend(line, ",\"window\":[", v.window_begin, ",", v.window_end, "]");
    line->append(",\"window_dims\":");
    AppendInts(v.window_dims, line);
  }
  line->append("}");
}

void AppendValuesLine(const std::vector<OperatorValue>& values, bool is_output, std::string* line) {
  line->append("[");
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) line->append(",");
    AppendValueLine(values[i], is_output, line);
  }
  line->append("]");
}

}  // namespace

void AppendOperatorRecordLine(const OperatorRecord& r, std::string* line) {
  absl::StrAppend(line, "{\"depth\":", r.depth, ",\"index\":", r.index, ",\"inputs\":");
  AppendValuesLine(r.inputs, /*is_output=*/false, line);
  absl::StrAppend(line, ",\"inputs_digest\":\"", DigestHex128(r.inputs_digest), "\",\"module\":");
  AppendJsonString(r.module, line);
  line->append(",\"op\":");
  AppendJsonString(r.op, line);
  line->append(",\"outputs\":");
  AppendValuesLine(r.outputs, /*is_output=*/true, line);
  absl::StrAppend(line, ",\"outputs_digest\":\"", DigestHex128(r.outputs_digest),
                  "\",\"parent\":", r.parent, "}");
}

bool OperatorRecording::LooksLikeOne(const std::string& path) {
  // Through the one reader: a FIFO or device is not opened (nothing blocks on it), and only the
  // short header line is looked at, however long the file's first line is.
  absl::StatusOr<std::shared_ptr<const MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) return false;
  constexpr size_t kHeaderLimit = 4096;
  const absl::string_view head = (*file)->bytes().substr(0, kHeaderLimit);
  const size_t newline = head.find('\n');
  if (newline == absl::string_view::npos) return false;
  absl::StatusOr<json> header = ParseJson(head.substr(0, newline), path);
  return header.ok() && header->is_object() && header->contains(kOperatorRecordingKey);
}

absl::StatusOr<OperatorRecording> OperatorRecording::Load(const std::string& path) {
  // The one reader: only a regular file (a FIFO is refused, not waited on), mapped, not copied.
  LOCKSTEP_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, MappedFile::Open(path));
  auto invalid = [&](int64_t line, absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ":", line, ": not a lockstep operator recording: ", why));
  };
  absl::string_view rest = file->bytes();
  int64_t line = 0;
  // The next line, without its newline; false at the end. A line longer than any record the
  // recorder writes is refused instead of being parsed (its JSON would take many times its size).
  absl::string_view text;
  absl::Status too_long;
  auto next_line = [&]() {
    if (rest.empty()) return false;
    ++line;
    const size_t newline = rest.find('\n');
    text = rest.substr(0, newline);
    rest.remove_prefix(newline == absl::string_view::npos ? rest.size() : newline + 1);
    if (text.size() > kMaxOperatorRecordLine) {
      too_long =
          invalid(line, absl::StrCat("a line of ", text.size(), " bytes exceeds the limit of ",
                                     kMaxOperatorRecordLine));
      return false;
    }
    return true;
  };
  if (!next_line()) return too_long.ok() ? invalid(1, "the file is empty") : too_long;
  absl::StatusOr<json> header = ParseJson(text, "its header line");
  if (!header.ok()) return invalid(1, header.status().message());
  absl::StatusOr<int64_t> version = JsonInt(*header, kOperatorRecordingKey, "the header line");
  if (!version.ok()) return invalid(1, version.status().message());
  if (*version != kOperatorRecordingVersion) {
    return invalid(1, absl::StrCat("format version ", *version, "; this build reads version ",
                                   kOperatorRecordingVersion));
  }
  int64_t rank = 0;
  if (header->contains("rank")) {
    absl::StatusOr<int64_t> given = JsonInt(*header, "rank", "the header line");
    if (!given.ok()) return invalid(1, given.status().message());
    if (*given < 0 || *given > std::numeric_limits<int>::max()) {
      return invalid(1, absl::StrCat("rank ", *given, " is not a rank"));
    }
    rank = *given;
  }
  std::vector<OperatorRecord> records;
  while (next_line()) {
    if (text.empty()) continue;
    absl::StatusOr<json> parsed = ParseJson(text, "the line");
    if (!parsed.ok()) return invalid(line, parsed.status().message());
    absl::StatusOr<OperatorRecord> r = RecordFromJson(*parsed);
    if (!r.ok()) return invalid(line, r.status().message());
    if (r->index != static_cast<int64_t>(records.size())) {
      return invalid(line, absl::StrCat("record ", records.size(), " has index ", r->index));
    }
    records.push_back(*std::move(r));
  }
  if (!too_long.ok()) return too_long;
  LOCKSTEP_RETURN_IF_ERROR(file->CheckUnchanged());
  return OperatorRecording(static_cast<int>(rank), std::move(records));
}

}  // namespace numerics
}  // namespace lockstep
