#include "base/json.h"

#include <cmath>
#include <limits>
#include <string>

#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

TEST(ParseJsonTest, ParsesAndNamesTheInputOfBadText) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(json value, ParseJson(R"({"a": [1, "x"]})", "in.json"));
  EXPECT_EQ(value["a"][1], "x");
  const absl::Status bad = ParseJson("{\"a\": ", "in.json").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("in.json"));
  EXPECT_THAT(bad.message(), HasSubstr("byte"));
}

// A 200 KB file of brackets overflowed the stack of every tool that wrote or compared it.
TEST(ParseJsonTest, DeepNestingIsRefusedWithoutRecursion) {
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  const absl::Status refused = ParseJson(deep, "deep.json").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("nested deeper than 64"));
  const std::string fine = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  LOCKSTEP_EXPECT_OK(ParseJson(fine, "fine.json").status());
  // Brackets inside strings are text, not nesting.
  LOCKSTEP_EXPECT_OK(ParseJson("[\"" + std::string(1000, '[') + "\\\"\"]", "s.json").status());
}

TEST(ParseJsonTest, ADuplicateKeyAtAnyDepthIsRefused) {
  const absl::Status twice = ParseJson(R"({"a": {"k": 1, "k": 2}})", "dup.json").status();
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.message(), HasSubstr("'k' appears twice"));
}

TEST(DumpJsonTest, BytesThatAreNotUtf8AreEscapedNeverThrown) {
  json value = {{"path", std::string("/data/caf\xe9/\xff.bin")}, {std::string("k\xc3"), 1}};
  std::string text;
  ASSERT_NO_THROW(text = DumpJson(value));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(json back, ParseJson(text, "dumped"));
  EXPECT_EQ(back["path"], "/data/caf\\xe9/\\xff.bin");
  EXPECT_EQ(back["k\\xc3"], 1);
  // Valid UTF-8 (two, three and four bytes) is untouched; overlong forms and surrogates are not.
  EXPECT_EQ(Utf8Escaped("\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(Utf8Escaped("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(Utf8Escaped("\xed\xa0\x80"), "\\xed\\xa0\\x80");
}

TEST(DumpJsonTest, AValueNestedTooDeepIsCutNotOverflowed) {
  json value = json::array();
  json* at = &value;
  for (int i = 0; i < 10'000; ++i) {
    at->push_back(json::array());
    at = &(*at)[0];
  }
  const std::string text = DumpJson(value);
  EXPECT_THAT(text, HasSubstr("nested deeper than 64 levels"));
  LOCKSTEP_EXPECT_OK(ParseJson(text, "cut").status());
}

// What ParseJson accepts, DumpJson writes back whole: the limit counts arrays and objects, not
// the scalars in the deepest one.
TEST(DumpJsonTest, ADocumentAtTheLimitIsWrittenBackWhole) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      json value, ParseJson(std::string(kMaxJsonDepth, '[') + "7" + std::string(kMaxJsonDepth, ']'),
                            "limit.json"));
  EXPECT_EQ(DumpJson(value),
            std::string(kMaxJsonDepth, '[') + "7" + std::string(kMaxJsonDepth, ']'));
  // The same depth with a string that needs escaping goes through the careful copy: still whole.
  json escaped = std::string("\xff");
  for (int i = 0; i < kMaxJsonDepth; ++i) escaped = json::array({escaped});
  EXPECT_EQ(DumpJson(escaped),
            std::string(kMaxJsonDepth, '[') + "\"\\\\xff\"" + std::string(kMaxJsonDepth, ']'));
}

// A key that is not UTF-8 and a key that spells its escaped form out are two members, not one.
TEST(DumpJsonTest, KeysThatEscapeAlikeAreBothKept) {
  const json value = {{std::string("k\xc3"), 1}, {std::string("k\\xc3"), 2}};
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(json back, ParseJson(DumpJson(value), "dumped"));
  EXPECT_EQ(back.size(), 2u) << DumpJson(value);
}

TEST(JsonAccessorsTest, AWrongTypeOrAMissingMemberIsAnErrorNamingIt) {
  const json record = {{"digest", 7},         {"n", 3},
                       {"big", UINT64_MAX},   {"ok", true},
                       {"o", json::object()}, {"a", json::array()}};
  const absl::Status wrong = JsonString(record, "digest", "record.json").status();
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.message(), HasSubstr("record.json: 'digest' is number, not a string"));
  EXPECT_THAT(JsonString(record, "none", "r").status().message(), HasSubstr("'none' is missing"));
  EXPECT_THAT(JsonInt(json::array(), "n", "r").status().message(), HasSubstr("found array"));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(int64_t n, JsonInt(record, "n", "r"));
  EXPECT_EQ(n, 3);
  EXPECT_FALSE(JsonInt(record, "big", "r").ok()) << "beyond int64";
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(double d, JsonNumber(record, "n", "r"));
  EXPECT_EQ(d, 3.0);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(bool ok, JsonBool(record, "ok", "r"));
  EXPECT_TRUE(ok);
  LOCKSTEP_EXPECT_OK(JsonObject(record, "o", "r").status());
  LOCKSTEP_EXPECT_OK(JsonArray(record, "a", "r").status());
  EXPECT_FALSE(JsonArray(record, "o", "r").ok());
}

// Note [JSON figures]: the non-finite figures are spelled "nan", "inf", "-inf", survive a dump
// and parse, and read back as what was written.
TEST(JsonFigureTest, NonFiniteFiguresAreNamedAndReadBack) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(JsonFigure(1.5), json(1.5));
  EXPECT_EQ(JsonFigure(inf), json("inf"));
  EXPECT_EQ(JsonFigure(-inf), json("-inf"));
  EXPECT_EQ(JsonFigure(std::nan("")), json("nan"));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      json back, ParseJson(DumpJson(json::array({JsonFigure(2.0), JsonFigure(-inf), JsonFigure(inf),
                                                 JsonFigure(std::nan(""))})),
                           "figures"));
  EXPECT_EQ(FigureFromJson(back[0]), 2.0);
  EXPECT_EQ(FigureFromJson(back[1]), -inf);
  EXPECT_EQ(FigureFromJson(back[2]), inf);
  EXPECT_TRUE(std::isnan(FigureFromJson(back[3])));
  EXPECT_TRUE(std::isnan(FigureFromJson(json("something else"))));
}

}  // namespace
}  // namespace lockstep
