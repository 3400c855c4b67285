// Fuzz target (base/fuzz_target.h) for base/json.h, the one way lockstep reads and writes JSON.
//
// Oracle, on arbitrary bytes: ParseJson returns a value or kInvalidArgument and never throws; an
// accepted value nests at most kMaxJsonDepth levels and DumpJson writes it (compact and indented)
// as text that parses back to the same value; the typed accessors answer for every member of an
// accepted object without throwing; and the input taken as a string (a path or an environment
// value: any bytes) is written by DumpJson as valid JSON that reads back as Utf8Escaped(input).
//
// The seeds are structure-aware: lockstep's own evidence shapes, nesting at and past the limit,
// a duplicate key deep inside, bytes that are not UTF-8, and an object of many members, so that
// the search starts where the limits are (tools/fuzz.sh gives it inputs large enough to reach
// them).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fuzz_target.h"
#include "base/json.h"

namespace lockstep {
namespace {

using nlohmann::json;

// The depth of `value` (a scalar is 0), walked with an explicit stack.
int Depth(const json& value) {
  int deepest = 0;
  std::vector<std::pair<const json*, int>> stack = {{&value, 0}};
  while (!stack.empty()) {
    const auto [node, depth] = stack.back();
    stack.pop_back();
    if (!node->is_structured()) continue;
    deepest = std::max(deepest, depth + 1);
    for (const json& child : *node) stack.push_back({&child, depth + 1});
  }
  return deepest;
}

std::string Nested(int depth, const std::string& open, const std::string& close,
                   const std::string& inner) {
  std::string text;
  for (int i = 0; i < depth; ++i) text += open;
  text += inner;
  for (int i = 0; i < depth; ++i) text += close;
  return text;
}

}  // namespace

std::vector<std::string> FuzzSeeds() {
  std::vector<std::string> seeds = {
      // Shapes of lockstep's own evidence: a report, a recording's records, an inventory.
      R"({"check":"repeatability","passed":true,"ranks":[{"rank":0,"state_digest":"0f1e",)"
      R"("steps":[1,2,3]}],"tolerance":{"atol":1e-05,"rtol":0.016},"note":null})",
      R"([{"index":0,"module":"block.0","kind":"forward","dtype":"float32","shape":[4,2],)"
      R"("digest":"00ff","summary":{"sum":-1.5e-3,"max":3.4028234663852886e38},"kept":true}])",
      R"({"tensors":{"w":{"dtype":"F32","shape":[3],"digest":"ab"}},"total_bytes":12})",
      // Escapes, surrogate pairs, a lone surrogate, numbers at the edges.
      R"({"s":"\u00e9\ud83d\ude00\n\t\"\\","lone":"\ud800","n":[-0,1e308,-9223372036854775808,)"
      R"(18446744073709551615,18446744073709551616,0.1]})",
      // Bytes that are not UTF-8, inside and outside strings.
      std::string("{\"path\":\"/data/\xff\xfe.safetensors\"}"),
      std::string("\xef\xbb\xbf{\"bom\":1}"),
      // A duplicate key deep inside.
      Nested(10, "{\"a\":", "}", "{\"k\":1,\"k\":2}"),
      // Nesting at the limit, one past it, and a 200 KB run of brackets.
      Nested(kMaxJsonDepth, "[", "]", "1"),
      Nested(kMaxJsonDepth + 1, "[", "]", "1"),
      Nested(kMaxJsonDepth, "{\"x\":", "}", "null"),
      Nested(100000, "[", "]", ""),
  };
  // An object of many members (a header of many tensors has this shape).
  std::string many = "{";
  for (int i = 0; i < 5000; ++i) {
    absl::StrAppend(&many, i == 0 ? "" : ",", "\"t", i, "\":{\"shape\":[", i, "]}");
  }
  seeds.push_back(many + "}");
  return seeds;
}

}  // namespace lockstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lockstep::DumpJson;
  using lockstep::ParseJson;
  using nlohmann::json;
  const std::string input(reinterpret_cast<const char*>(data), size);

  // Any bytes as a string value: written as valid JSON that reads back escaped.
  const std::string written = DumpJson(json(input));
  absl::StatusOr<json> string_back = ParseJson(written, "the written string");
  LOCKSTEP_FUZZ_CHECK(string_back.ok(), string_back.status().ToString());
  LOCKSTEP_FUZZ_CHECK(*string_back == json(lockstep::Utf8Escaped(input)),
                      "a string did not read back as its escaped bytes");

  absl::StatusOr<json> parsed = ParseJson(input, "fuzz");
  if (!parsed.ok()) {
    LOCKSTEP_FUZZ_CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument,
                        parsed.status().ToString());
    return 0;
  }
  LOCKSTEP_FUZZ_CHECK(lockstep::Depth(*parsed) <= lockstep::kMaxJsonDepth,
                      absl::StrCat("accepted a value nested ", lockstep::Depth(*parsed), " deep"));
  for (const int indent : {-1, 2}) {
    absl::StatusOr<json> again = ParseJson(DumpJson(*parsed, indent), "the written value");
    LOCKSTEP_FUZZ_CHECK(again.ok(), again.status().ToString());
    // Strings that were not UTF-8 cannot be in a parsed value (the parser refuses them), so the
    // value reads back exactly.
    LOCKSTEP_FUZZ_CHECK(*again == *parsed, absl::StrCat("indent ", indent, " changed the value"));
  }
  if (parsed->is_object()) {
    for (const auto& [key, member] : parsed->items()) {
      // Each accessor either returns the member or an error; which one depends on the type.
      const bool string_ok = lockstep::JsonString(*parsed, key, "fuzz").ok();
      LOCKSTEP_FUZZ_CHECK(string_ok == member.is_string(), key);
      (void)lockstep::JsonInt(*parsed, key, "fuzz");
      (void)lockstep::JsonNumber(*parsed, key, "fuzz");
      const bool bool_ok = lockstep::JsonBool(*parsed, key, "fuzz").ok();
      LOCKSTEP_FUZZ_CHECK(bool_ok == member.is_boolean(), key);
      LOCKSTEP_FUZZ_CHECK(lockstep::JsonObject(*parsed, key, "fuzz").ok() == member.is_object(),
                          key);
      LOCKSTEP_FUZZ_CHECK(lockstep::JsonArray(*parsed, key, "fuzz").ok() == member.is_array(), key);
    }
  }
  return 0;
}
