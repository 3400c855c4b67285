#include "base/json.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace {

using json = nlohmann::json;

// The deepest nesting of `text`'s arrays and objects, and the byte where it first passes
// kMaxJsonDepth (or npos). Linear; brackets inside strings do not count.
size_t FirstTooDeep(absl::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return absl::string_view::npos;
}

const char* TypeName(const json& value) {
  return value.is_discarded() ? "missing" : value.type_name();
}

absl::Status WrongMember(const json& object, absl::string_view key, absl::string_view what,
                         absl::string_view wanted) {
  if (!object.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected an object with '", key, "', found ", object.type_name()));
  }
  const auto found = object.find(std::string(key));
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": '", key, "' is ",
                   found == object.end() ? std::string("missing")
                                         : absl::StrCat(TypeName(*found), ", not ", wanted)));
}

// The member `key` if `object` is an object that has it and `is` accepts it.
template <typename Is>
const json* Member(const json& object, absl::string_view key, Is is) {
  if (!object.is_object()) return nullptr;
  const auto found = object.find(std::string(key));
  if (found == object.end() || !is(*found)) return nullptr;
  return &*found;
}

// Whether `value` (an array or object at nesting `depth`, the top one at 1, as ParseJson counts)
// nests deeper than the limit or holds a string or key that is not UTF-8. Recursion is bounded by
// the limit.
bool NeedsCare(const json& value, int depth) {
  if (value.is_structured() && depth > kMaxJsonDepth) return true;
  if (value.is_string())
    return Utf8Escaped(value.get_ref<const std::string&>()) != value.get_ref<const std::string&>();
  if (value.is_object()) {
    for (const auto& [key, member] : value.items()) {
      if (Utf8Escaped(key) != key || NeedsCare(member, depth + 1)) return true;
    }
  } else if (value.is_array()) {
    for (const json& element : value) {
      if (NeedsCare(element, depth + 1)) return true;
    }
  }
  return false;
}

// A copy of `value` with strings escaped and nesting cut at the limit. Two keys of one object that
// escape alike (bytes that are not UTF-8 in one, the same text spelled out in the other) are both
// kept, the later one with a suffix.
json Cared(const json& value, int depth) {
  if (value.is_structured() && depth > kMaxJsonDepth) {
    return absl::StrCat("(nested deeper than ", kMaxJsonDepth, " levels: not written)");
  }
  if (value.is_string()) return Utf8Escaped(value.get_ref<const std::string&>());
  if (value.is_object()) {
    json out = json::object();
    for (const auto& [key, member] : value.items()) {
      std::string escaped = Utf8Escaped(key);
      for (int n = 2; out.contains(escaped); ++n) {
        escaped = absl::StrCat(Utf8Escaped(key), " (", n, ": its bytes are not UTF-8)");
      }
      out[escaped] = Cared(member, depth + 1);
    }
    return out;
  }
  if (value.is_array()) {
    json out = json::array();
    for (const json& element : value) out.push_back(Cared(element, depth + 1));
    return out;
  }
  return value;
}

// The length of the valid UTF-8 sequence at `text[i]`, or 0.
size_t Utf8SequenceAt(absl::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t length;
  uint32_t min;
  uint32_t code;
  if ((c & 0xe0) == 0xc0) {
    length = 2, min = 0x80, code = c & 0x1f;
  } else if ((c & 0xf0) == 0xe0) {
    length = 3, min = 0x800, code = c & 0x0f;
  } else if ((c & 0xf8) == 0xf0) {
    length = 4, min = 0x10000, code = c & 0x07;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
    code = (code << 6) | (byte(i + k) & 0x3f);
  }
  if (code < min || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return 0;
  return length;
}

// Builds the parsed value through nlohmann's SAX interface. nlohmann's callback parser (the only
// one of its parsers that shows keys) rescans the enclosing object at the end of every object,
// which made a header of n tensors cost O(n^2); this builder is linear. A key repeated within
// one object stops the parse (nlohmann's own parsers keep the last silently).
class DomBuilder {
 public:
  bool null() { return Add(json(nullptr)); }
  bool boolean(bool v) { return Add(json(v)); }
  bool number_integer(json::number_integer_t v) { return Add(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return Add(json(v)); }
  bool number_float(json::number_float_t v, const std::string&) { return Add(json(v)); }
  bool string(std::string& v) { return Add(json(std::move(v))); }
  bool binary(json::binary_t& v) { return Add(json::binary(std::move(v))); }
  bool start_object(std::size_t) { return Open(json::object()); }
  bool start_array(std::size_t) { return Open(json::array()); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }
  bool key(std::string& k) {
    if (open_.back()->contains(k)) {
      duplicate_ = k;
      return false;
    }
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t byte, const std::string&, const nlohmann::detail::exception& e) {
    error_byte_ = byte;
    error_ = e.what();
    return false;
  }

  json Take() { return std::move(root_); }
  const std::string& duplicate() const { return duplicate_; }
  const std::string& error() const { return error_; }
  size_t error_byte() const { return error_byte_; }

 private:
  // Places `v` where the parse is (the root, the end of the open array, or the open object's
  // key) and returns where it now lives.
  json* Place(json v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    return &(parent[key_] = std::move(v));
  }
  bool Add(json v) {
    Place(std::move(v));
    return true;
  }
  // An open container's address stays valid: its parent grows only after it closes.
  bool Open(json v) {
    open_.push_back(Place(std::move(v)));
    return true;
  }
  bool Close() {
    open_.pop_back();
    return true;
  }

  json root_;
  std::vector<json*> open_;
  std::string key_;
  std::string duplicate_;
  std::string error_;
  size_t error_byte_ = 0;
};

}  // namespace

void AppendJsonString(absl::string_view text, std::string* out) {
  for (char c : text) {
    if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') {
      out->append(DumpJson(json(std::string(text))));
      return;
    }
  }
  out->push_back('"');
  out->append(text.data(), text.size());
  out->push_back('"');
}

std::string Utf8Escaped(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t length = Utf8SequenceAt(text, i);
    if (length == 0) {
      static constexpr char kHex[] = "0123456789abcdef";
      const unsigned char c = static_cast<unsigned char>(text[i]);
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
      ++i;
    } else {
      out.append(text.data() + i, length);
      i += length;
    }
  }
  return out;
}

absl::StatusOr<json> ParseJson(absl::string_view text, absl::string_view what) {
  if (const size_t at = FirstTooDeep(text); at != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": JSON nested deeper than ",
                                                   kMaxJsonDepth, " levels (at byte ", at, ")"));
  }
  DomBuilder builder;
  bool parsed = false;
  try {
    parsed = json::sax_parse(text.begin(), text.end(), &builder);
  } catch (const json::exception& e) {  // not expected from the SAX path; never let it escape
    return absl::InvalidArgumentError(absl::StrCat(what, ": not valid JSON: ", e.what()));
  } catch (const std::exception& e) {  // allocation
    return absl::ResourceExhaustedError(absl::StrCat(what, ": cannot parse: ", e.what()));
  }
  if (!parsed) {
    if (!builder.duplicate().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": key '", Utf8Escaped(builder.duplicate()), "' appears twice in one object"));
    }
    return absl::InvalidArgumentError(absl::StrCat(what, ": not valid JSON (at byte ",
                                                   builder.error_byte(), "): ", builder.error()));
  }
  return builder.Take();
}

std::string DumpJson(const json& value, int indent) {
  try {
    const json* source = &value;
    json cared;
    if (NeedsCare(value, 1)) {
      cared = Cared(value, 1);
      source = &cared;
    }
    try {
      return source->dump(indent);
    } catch (const json::exception&) {  // not reachable once cared for; never let it escape
      return source->dump(indent, ' ', false, json::error_handler_t::replace);
    }
  } catch (const std::exception& e) {  // out of memory: a valid document that says so
    return absl::StrCat("{\"error\": \"the JSON could not be written: ", Utf8Escaped(e.what()),
                        "\"}");
  }
}

absl::StatusOr<std::string> JsonString(const json& object, absl::string_view key,
                                       absl::string_view what) {
  const json* m = Member(object, key, [](const json& v) { return v.is_string(); });
  if (m == nullptr) return WrongMember(object, key, what, "a string");
  return m->get<std::string>();
}

absl::StatusOr<int64_t> JsonInt(const json& object, absl::string_view key, absl::string_view what) {
  const json* m = Member(object, key, [](const json& v) {
    return v.is_number_integer() &&
           (!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX));
  });
  if (m == nullptr) return WrongMember(object, key, what, "an integer of 64 bits");
  return m->get<int64_t>();
}

absl::StatusOr<double> JsonNumber(const json& object, absl::string_view key,
                                  absl::string_view what) {
  const json* m = Member(object, key, [](const json& v) { return v.is_number(); });
  if (m == nullptr) return WrongMember(object, key, what, "a number");
  return m->get<double>();
}

absl::StatusOr<bool> JsonBool(const json& object, absl::string_view key, absl::string_view what) {
  const json* m = Member(object, key, [](const json& v) { return v.is_boolean(); });
  if (m == nullptr) return WrongMember(object, key, what, "a boolean");
  return m->get<bool>();
}

absl::StatusOr<const json*> JsonObject(const json& object, absl::string_view key,
                                       absl::string_view what) {
  const json* m = Member(object, key, [](const json& v) { return v.is_object(); });
  if (m == nullptr) return WrongMember(object, key, what, "an object");
  return m;
}

absl::StatusOr<const json*> JsonArray(const json& object, absl::string_view key,
                                      absl::string_view what) {
  const json* m = Member(object, key, [](const json& v) { return v.is_array(); });
  if (m == nullptr) return WrongMember(object, key, what, "an array");
  return m;
}

json JsonFigure(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return value;
}

double FigureFromJson(const json& figure) {
  if (figure.is_number()) return figure.get<double>();
  const std::string s = figure.is_string() ? figure.get<std::string>() : "nan";
  if (s == "inf") return std::numeric_limits<double>::infinity();
  if (s == "-inf") return -std::numeric_limits<double>::infinity();
  return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace lockstep
