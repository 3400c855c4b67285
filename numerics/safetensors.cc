#include "numerics/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_io.h"
#include "base/json.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "nlohmann/json.hpp"
#include "torch/version.h"

namespace lockstep {
namespace numerics {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors bytes are little-endian, as this host's");

using json = nlohmann::json;

struct DtypeName {
  at::ScalarType dtype;
  const char* name;
};

// The format's names for the dtypes LibTorch has.
constexpr DtypeName kDtypes[] = {
    {at::kDouble, "F64"},
    {at::kFloat, "F32"},
    {at::kHalf, "F16"},
    {at::kBFloat16, "BF16"},
    {at::kLong, "I64"},
    {at::kInt, "I32"},
    {at::kShort, "I16"},
    {at::kChar, "I8"},
    {at::kByte, "U8"},
    {at::kBool, "BOOL"},
#if TORCH_VERSION_MAJOR >= 2
    {at::kFloat8_e4m3fn, "F8_E4M3"},
    {at::kFloat8_e5m2, "F8_E5M2"},
    {at::kUInt16, "U16"},
    {at::kUInt32, "U32"},
    {at::kUInt64, "U64"},
#endif
};

absl::Status Invalid(absl::string_view what, absl::string_view detail) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": not a valid safetensors file: ", detail));
}

// A non-negative JSON integer, or an error naming `field`.
absl::StatusOr<uint64_t> Unsigned(const json& value, absl::string_view field) {
  if (!value.is_number_unsigned()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", DumpJson(value), ", not a non-negative integer"));
  }
  return value.get<uint64_t>();
}

// Parses the header, refusing a duplicate key at any depth (nlohmann keeps the last silently).
absl::StatusOr<json> ParseHeader(absl::string_view text) {
  // base/json.h: linear, depth-bounded, duplicate keys refused.
  LOCKSTEP_ASSIGN_OR_RETURN(json header, ParseJson(text, "the header"));
  if (!header.is_object()) return absl::InvalidArgumentError("the header is not a JSON object");
  return header;
}

struct Range {
  uint64_t begin;
  uint64_t end;
  size_t entry;
};

// Reads the header's "__metadata__" object `value` (string values only) into `metadata`.
absl::Status ParseMetadata(const json& value, absl::string_view what,
                           std::map<std::string, std::string>& metadata) {
  if (!value.is_object()) return Invalid(what, "__metadata__ is not an object");
  for (const auto& [key, text] : value.items()) {
    if (!text.is_string()) {
      return Invalid(what, absl::StrCat("metadata '", key, "' is not a string"));
    }
    metadata[key] = text.get<std::string>();
  }
  return absl::OkStatus();
}

// The bytes a tensor (`where`) of dtype `dtype` and header shape `shape` holds; its dimensions
// into `dims`. Refuses a shape that is not an array of non-negative integers, or whose byte count
// overflows 64 bits.
absl::StatusOr<uint64_t> ShapeBytes(const json& shape, at::ScalarType dtype, absl::string_view what,
                                    const std::string& where, std::vector<int64_t>& dims) {
  if (!shape.is_array()) return Invalid(what, absl::StrCat(where, ": shape is not an array"));
  uint64_t elements = 1;
  bool overflow = false;
  for (size_t d = 0; d < shape.size(); ++d) {
    absl::StatusOr<uint64_t> dim = Unsigned(shape[d], absl::StrCat("shape[", d, "]"));
    if (!dim.ok()) return Invalid(what, absl::StrCat(where, ": ", dim.status().message()));
    if (*dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow = true;
    dims.push_back(static_cast<int64_t>(*dim));
    if (*dim != 0 && elements > std::numeric_limits<uint64_t>::max() / *dim) overflow = true;
    elements = overflow ? 0 : elements * *dim;
  }
  const uint64_t item = c10::elementSize(dtype);
  if (overflow || elements > std::numeric_limits<uint64_t>::max() / item) {
    return Invalid(what, absl::StrCat(where, ": shape ", DumpJson(shape), " overflows 64 bits"));
  }
  return elements * item;
}

// The data_offsets [begin, end) of a tensor's header entry `value` (`where`): a range inside the
// `buffer_size`-byte buffer holding the `bytes` bytes its shape needs.
absl::Status ParseDataOffsets(const json& value, uint64_t bytes, uint64_t buffer_size,
                              absl::string_view what, const std::string& where, uint64_t& begin,
                              uint64_t& end) {
  const json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    return Invalid(what, absl::StrCat(where, ": data_offsets is not [begin, end]"));
  }
  absl::StatusOr<uint64_t> first = Unsigned(offsets[0], "data_offsets[0]");
  absl::StatusOr<uint64_t> last = Unsigned(offsets[1], "data_offsets[1]");
  if (!first.ok() || !last.ok()) {
    return Invalid(what,
                   absl::StrCat(where, ": ", (!first.ok() ? first : last).status().message()));
  }
  if (*first > *last || *last > buffer_size) {
    return Invalid(what,
                   absl::StrCat(where, ": data_offsets [", *first, ", ", *last,
                                ") are not a range inside the ", buffer_size, "-byte buffer"));
  }
  if (*last - *first != bytes) {
    return Invalid(what, absl::StrCat(where, ": data_offsets [", *first, ", ", *last, ") hold ",
                                      *last - *first, " bytes; shape ", DumpJson(value["shape"]),
                                      " of ", value["dtype"].get<std::string>(), " needs ", bytes));
  }
  begin = *first;
  end = *last;
  return absl::OkStatus();
}

// Every byte of a bool tensor's `bytes` (`where`) is 0 or 1.
absl::Status CheckBoolBytes(absl::string_view bytes, absl::string_view what,
                            const std::string& where) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (static_cast<uint8_t>(bytes[i]) > 1) {
      return Invalid(
          what, absl::StrCat(where, ": bool element ", i, " is byte ",
                             static_cast<int>(static_cast<uint8_t>(bytes[i])), ", not 0 or 1"));
    }
  }
  return absl::OkStatus();
}

// Tensor `name`'s header entry `value`, read against `buffer`; its byte range into `range`.
absl::StatusOr<SafetensorsEntry> ParseTensor(const std::string& name, const json& value,
                                             absl::string_view buffer, absl::string_view what,
                                             Range& range) {
  const std::string where = absl::StrCat("tensor '", name, "'");
  if (name.empty()) return Invalid(what, "a tensor has an empty name");
  if (!value.is_object() || value.size() != 3 || !value.contains("dtype") ||
      !value.contains("shape") || !value.contains("data_offsets")) {
    return Invalid(what, absl::StrCat(where,
                                      " is not an object with exactly dtype, shape and "
                                      "data_offsets"));
  }
  SafetensorsEntry entry;
  entry.name = name;
  if (!value["dtype"].is_string())
    return Invalid(what, absl::StrCat(where, ": dtype is not a string"));
  absl::StatusOr<at::ScalarType> dtype = SafetensorsDtype(value["dtype"].get<std::string>());
  if (!dtype.ok()) return Invalid(what, absl::StrCat(where, ": ", dtype.status().message()));
  entry.dtype = *dtype;
  LOCKSTEP_ASSIGN_OR_RETURN(const uint64_t bytes,
                            ShapeBytes(value["shape"], entry.dtype, what, where, entry.shape));
  LOCKSTEP_RETURN_IF_ERROR(
      ParseDataOffsets(value, bytes, buffer.size(), what, where, range.begin, range.end));
  entry.bytes = buffer.substr(range.begin, range.end - range.begin);
  if (entry.dtype == at::kBool) LOCKSTEP_RETURN_IF_ERROR(CheckBoolBytes(entry.bytes, what, where));
  return entry;
}

// Checks that the tensors' `ranges` tile the `buffer_size`-byte buffer and orders `entries` by
// offset. `ranges` (one per entry) is sorted here.
absl::Status OrderByOffset(std::vector<Range>& ranges, std::vector<SafetensorsEntry>& entries,
                           uint64_t buffer_size, absl::string_view what) {
  // The ranges must tile the buffer: sorted by (begin, end), each starts where the last ended.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (const Range& range : ranges) {
    const std::string& name = entries[range.entry].name;
    if (range.begin != covered) {
      return Invalid(what, absl::StrCat("tensor '", name, "' starts at byte ", range.begin,
                                        range.begin < covered ? ", overlapping the tensor before it"
                                                              : ", leaving a hole",
                                        " (the buffer is covered up to ", covered, ")"));
    }
    covered = range.end;
  }
  if (covered != buffer_size) {
    return Invalid(what, absl::StrCat("the tensors cover ", covered, " of the ", buffer_size,
                                      " buffer bytes"));
  }
  std::vector<SafetensorsEntry> ordered;
  ordered.reserve(ranges.size());
  for (const Range& range : ranges) ordered.push_back(std::move(entries[range.entry]));
  entries = std::move(ordered);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> SafetensorsDtypeName(at::ScalarType dtype) {
  for (const DtypeName& d : kDtypes) {
    if (d.dtype == dtype) return std::string(d.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype ", c10::toString(dtype), " has no safetensors name"));
}

absl::StatusOr<at::ScalarType> SafetensorsDtype(absl::string_view name) {
  for (const DtypeName& d : kDtypes) {
    if (name == d.name) return d.dtype;
  }
  std::string known;
  for (const DtypeName& d : kDtypes) absl::StrAppend(&known, known.empty() ? "" : ", ", d.name);
  return absl::InvalidArgumentError(
      absl::StrCat("dtype '", name, "' is not one this LibTorch reads (", known, ")"));
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, MappedFile::Open(path));
  const absl::string_view bytes = file->bytes();
  absl::StatusOr<SafetensorsFile> parsed = Parse(file, bytes, path);
  // Parsing read the header (and every bool tensor): from the file as it was, or refused.
  LOCKSTEP_RETURN_IF_ERROR(file->CheckUnchanged());
  if (parsed.ok()) parsed->mapped_ = std::move(file);
  return parsed;
}

absl::Status SafetensorsFile::CheckUnchanged() const {
  return mapped_ == nullptr ? absl::OkStatus() : mapped_->CheckUnchanged();
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::FromBytes(std::string bytes, std::string what) {
  auto owned = std::make_shared<const std::string>(std::move(bytes));
  const absl::string_view view = *owned;
  return Parse(std::move(owned), view, std::move(what));
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::shared_ptr<const void> owner,
                                                       absl::string_view bytes, std::string what) {
  if (bytes.size() < 8) {
    return Invalid(what, absl::StrCat(bytes.size(), " bytes, fewer than the 8 of the length"));
  }
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  if (header_size > kMaxSafetensorsHeaderBytes || header_size > bytes.size() - 8) {
    return Invalid(
        what,
        absl::StrCat("header length ", header_size, " exceeds ",
                     header_size > kMaxSafetensorsHeaderBytes
                         ? absl::StrCat("the format's limit of ", kMaxSafetensorsHeaderBytes)
                         : absl::StrCat("the ", bytes.size() - 8, " bytes after the length")));
  }
  absl::StatusOr<json> header = ParseHeader(bytes.substr(8, header_size));
  if (!header.ok()) return Invalid(what, header.status().message());
  const absl::string_view buffer = bytes.substr(8 + header_size);

  SafetensorsFile file;
  file.what_ = what;
  file.owner_ = std::move(owner);
  file.bytes_ = bytes;
  std::vector<Range> ranges;
  for (const auto& [name, value] : header->items()) {
    if (name == "__metadata__") {
      LOCKSTEP_RETURN_IF_ERROR(ParseMetadata(value, what, file.metadata_));
      continue;
    }
    Range range{0, 0, file.entries_.size()};
    LOCKSTEP_ASSIGN_OR_RETURN(SafetensorsEntry entry,
                              ParseTensor(name, value, buffer, what, range));
    ranges.push_back(range);
    file.entries_.push_back(std::move(entry));
  }
  LOCKSTEP_RETURN_IF_ERROR(OrderByOffset(ranges, file.entries_, buffer.size(), what));
  file.index_.reserve(file.entries_.size());
  for (size_t i = 0; i < file.entries_.size(); ++i) file.index_.emplace(file.entries_[i].name, i);
  return file;
}

const SafetensorsEntry* SafetensorsFile::Find(absl::string_view name) const {
  const auto found = index_.find(std::string(name));
  return found == index_.end() ? nullptr : &entries_[found->second];
}

absl::StatusOr<at::Tensor> SafetensorsFile::Copy(const SafetensorsEntry& entry) const {
  at::Tensor tensor;
  LOCKSTEP_RETURN_IF_ERROR(
      CallTorch(absl::StrCat("reading tensor '", entry.name, "' of ", what_), [&] {
        tensor = at::empty(entry.shape, at::TensorOptions().dtype(entry.dtype));
        if (!entry.bytes.empty()) {
          std::memcpy(tensor.data_ptr(), entry.bytes.data(), entry.bytes.size());
        }
      }));
  return tensor;
}

absl::StatusOr<at::Tensor> SafetensorsFile::Tensor(absl::string_view name) const {
  const SafetensorsEntry* entry = Find(name);
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat(what_, " has no tensor '", name, "'"));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor tensor, Copy(*entry));
  LOCKSTEP_RETURN_IF_ERROR(CheckUnchanged());
  return tensor;
}

absl::StatusOr<NamedTensors> SafetensorsFile::Tensors() const {
  NamedTensors tensors;
  tensors.reserve(entries_.size());
  for (const SafetensorsEntry& entry : entries_) {
    LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor tensor, Copy(entry));
    tensors.emplace_back(entry.name, std::move(tensor));
  }
  LOCKSTEP_RETURN_IF_ERROR(CheckUnchanged());
  return tensors;
}

// Note [Safetensors header text]
// The header is written straight, not as an nlohmann value dumped: a capture names thousands of
// tensors, and building the value (a map per tensor, a string per key) cost more than copying
// their bytes. The text is what DumpJson of that value wrote: keys in byte order (the tensors'
// names and __metadata__ together, as nlohmann's map sorts them), each entry's keys in the order
// data_offsets, dtype, shape; no spaces; strings through AppendJsonString. safetensors_test holds
// the two equal.
absl::StatusOr<SafetensorsPieces> SafetensorsPieces::Make(
    const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  // The header is JSON text: a name or metadata string that is not UTF-8 cannot be written as it
  // is (DumpJson would escape it, and the file would read back under another name).
  auto not_utf8 = [](absl::string_view what, const std::string& text) {
    return absl::InvalidArgumentError(
        absl::StrCat("the safetensors header cannot be written: ", what, " '", Utf8Escaped(text),
                     "' is not UTF-8 (the header is JSON text)"));
  };
  std::map<std::string, std::string> entries;  // key -> its value's JSON text
  if (!metadata.empty()) {
    std::string text = "{";
    for (const auto& [key, value] : metadata) {
      if (Utf8Escaped(key) != key) return not_utf8("the metadata key", key);
      if (Utf8Escaped(value) != value)
        return not_utf8(absl::StrCat("metadata '", key, "''s value"), value);
      if (text.size() > 1) text.push_back(',');
      AppendJsonString(key, &text);
      text.push_back(':');
      AppendJsonString(value, &text);
    }
    text.push_back('}');
    entries.emplace("__metadata__", std::move(text));
  }
  SafetensorsPieces out;
  out.buffer_.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (Utf8Escaped(name) != name) return not_utf8("the tensor name", name);
    if (name.empty() || name == "__metadata__" || entries.count(name) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name '", name,
                       "' is empty, reserved or given twice; safetensors names are "
                       "unique and not __metadata__"));
    }
    if (!tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is undefined"));
    }
    LOCKSTEP_ASSIGN_OR_RETURN(std::string dtype, SafetensorsDtypeName(tensor.scalar_type()));
    at::Tensor bytes;
    const at::Tensor& source = tensor;  // a lambda may not capture a structured binding (C++17)
    LOCKSTEP_RETURN_IF_ERROR(CallTorch(absl::StrCat("copying tensor '", name, "' for writing"),
                                       [&] { bytes = source.to(at::kCPU).contiguous(); }));
    const uint64_t size = bytes.numel() * bytes.element_size();
    std::string text =
        absl::StrCat("{\"data_offsets\":[", offset, ",", offset + size, "],\"dtype\":");
    AppendJsonString(dtype, &text);
    absl::StrAppend(&text, ",\"shape\":[", absl::StrJoin(tensor.sizes(), ","), "]}");
    entries.emplace(name, std::move(text));
    offset += size;
    out.buffer_.push_back(std::move(bytes));
  }
  std::string header = "{";
  for (const auto& [key, value] : entries) {
    if (header.size() > 1) header.push_back(',');
    AppendJsonString(key, &header);
    header.push_back(':');
    header.append(value);
  }
  header.push_back('}');
  // The buffer 8-byte aligned: pad the header with spaces (the format allows trailing ones).
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t header_size = header.size();
  out.prefix_.assign(reinterpret_cast<const char*>(&header_size), 8);
  out.prefix_.append(header);
  out.buffer_bytes_ = offset;
  return out;
}

std::vector<absl::string_view> SafetensorsPieces::pieces() const {
  std::vector<absl::string_view> views;
  views.reserve(1 + buffer_.size());
  views.emplace_back(prefix_);
  for (const at::Tensor& t : buffer_) {
    const size_t size = t.numel() * t.element_size();
    if (size > 0) views.emplace_back(static_cast<const char*>(t.data_ptr()), size);
  }
  return views;
}

absl::StatusOr<std::string> SerializeSafetensors(
    const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  LOCKSTEP_ASSIGN_OR_RETURN(SafetensorsPieces pieces, SafetensorsPieces::Make(tensors, metadata));
  std::string out;
  out.reserve(pieces.size());
  for (absl::string_view piece : pieces.pieces()) out.append(piece.data(), piece.size());
  return out;
}

absl::Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata) {
  LOCKSTEP_ASSIGN_OR_RETURN(SafetensorsPieces pieces, SafetensorsPieces::Make(tensors, metadata));
  const std::vector<absl::string_view> views = pieces.pieces();
  return WriteFileAtomically(path, views);
}

}  // namespace numerics
}  // namespace lockstep
