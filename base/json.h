// base/json.h
//
// The one way lockstep reads and writes JSON (nlohmann/json, wrapped once), so that no file or
// environment a tool meets can crash it:
// - ParseJson refuses, as kInvalidArgument naming the input and the byte, text that is not JSON,
//   nests deeper than kMaxJsonDepth (nlohmann's writer, comparison and copy recurse: a 200 KB file
//   of brackets would overflow the stack), or repeats a key within an object (nlohmann keeps the
//   last silently). No exception escapes.
// - DumpJson never throws: a string or key that is not UTF-8 (a Linux path is bytes, so is an
//   environment value) is written with each byte that is not part of valid UTF-8 as the four
//   characters \xXX (Utf8Escaped; the JSON text shows them as "\\xXX"), so the output is valid
//   JSON and the bytes can be read back by eye; a value nested deeper than kMaxJsonDepth (only a
//   caller's own construction can make one) is cut there, with a string saying so.
// - Note [JSON figures]: JSON has no NaN or infinity, so lockstep's evidence writes a non-finite
//   figure as the string "nan", "inf" or "-inf" (JsonFigure) and reads it back with
//   FigureFromJson; every writer of figures (comparisons, module and operator recordings) uses
//   this one spelling, and the report pages read it.
// - The Json* accessors read a member of an object with its type checked: kInvalidArgument
//   naming the input, the member and the type found.
//
// Thread-safety: stateless.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(nlohmann::json record, ParseJson(text, path));
//   LOCKSTEP_ASSIGN_OR_RETURN(std::string digest, JsonString(record, "state_digest", path));
//   LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomically(out, DumpJson(evidence, 2) + "\n"));

#ifndef LOCKSTEP_BASE_JSON_H_
#define LOCKSTEP_BASE_JSON_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace lockstep {

// Deeper than any of lockstep's own formats nests (they stay under 10 levels).
inline constexpr int kMaxJsonDepth = 64;

// Parses `text` (see the top of this file); `what` names it in errors.
absl::StatusOr<nlohmann::json> ParseJson(absl::string_view text, absl::string_view what);

// `value` as JSON text, `indent` spaces per level (-1: one line). Never throws.
std::string DumpJson(const nlohmann::json& value, int indent = -1);

// `value` as a JSON number, or "nan", "inf", "-inf" when it is not finite (Note [JSON figures]).
nlohmann::json JsonFigure(double value);
// A figure JsonFigure wrote: a number as it is, "inf" and "-inf" as the infinities, anything
// else (including "nan") as NaN.
double FigureFromJson(const nlohmann::json& figure);

// `text` if it is valid UTF-8, otherwise with every byte outside a valid sequence as "\xXX".
std::string Utf8Escaped(absl::string_view text);

// Appends `text` as DumpJson writes a JSON string (quoted, escaped, non-UTF-8 bytes as Utf8Escaped
// shows them), for writers that build a line per record or per tensor themselves instead of a
// JSON value first (Note [Record lines] in numerics/op_recording.cc): text of printable ASCII
// other than '"' and '\\' is quoted as it is, anything else goes through DumpJson.
void AppendJsonString(absl::string_view text, std::string* out);

// The member `key` of `object`, of the type asked for. kInvalidArgument naming `what`, the key
// and the type found, for a missing member, a wrong type, or an `object` that is not an object.

// The string member `key` of `object` (see above).
absl::StatusOr<std::string> JsonString(const nlohmann::json& object, absl::string_view key,
                                       absl::string_view what);
// The integer member `key` of `object`: a JSON integer that fits in 64 signed bits (see above).
absl::StatusOr<int64_t> JsonInt(const nlohmann::json& object, absl::string_view key,
                                absl::string_view what);
// The number member `key` of `object`, integer or not, as a double (see above).
absl::StatusOr<double> JsonNumber(const nlohmann::json& object, absl::string_view key,
                                  absl::string_view what);
// The boolean member `key` of `object` (see above).
absl::StatusOr<bool> JsonBool(const nlohmann::json& object, absl::string_view key,
                              absl::string_view what);
// The object member `key` of `object`, by pointer into `object` (valid while it is; see above).
absl::StatusOr<const nlohmann::json*> JsonObject(const nlohmann::json& object,
                                                 absl::string_view key, absl::string_view what);
// The array member `key` of `object`, by pointer into `object` (valid while it is; see above).
absl::StatusOr<const nlohmann::json*> JsonArray(const nlohmann::json& object, absl::string_view key,
                                                absl::string_view what);

}  // namespace lockstep

#endif  // LOCKSTEP_BASE_JSON_H_
