// numerics/safetensors: round trips of every dtype, reading a file written by an independent
// implementation (testdata/make_fixtures.py), and hostile headers refused with a clear error.

#include "numerics/safetensors.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace lockstep {
namespace numerics {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

TEST(SafetensorsTest, RoundTripsEveryDtypeShapeAndLayout) {
  at::manual_seed(1);
  const at::Tensor transposed = at::randn({3, 4}).t();  // non-contiguous
  ASSERT_FALSE(transposed.is_contiguous());
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"f32_t", transposed},
      {"f64", at::randn({2, 2}, at::kDouble)},
      {"f16", at::randn({5}).to(at::kHalf)},
      {"bf16", at::randn({5}).to(at::kBFloat16)},
      {"i64", at::randint(-1000, 1000, {4}, at::kLong)},
      {"i32", at::randint(-1000, 1000, {4}, at::kInt)},
      {"i16", at::randint(-1000, 1000, {4}, at::kShort)},
      {"i8", at::randint(-100, 100, {4}, at::kChar)},
      {"u8", at::randint(0, 255, {4}, at::kByte)},
      {"bool", at::rand({3}).gt(0.5)},
      {"scalar", at::scalar_tensor(2.5)},
      {"empty", at::empty({0, 3})},
  };
  const std::string path = testing::TempDir() + "/round_trip.safetensors";
  LOCKSTEP_ASSERT_OK(WriteSafetensors(path, tensors, {{"step", "7"}}));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(SafetensorsFile file, SafetensorsFile::Open(path));
  EXPECT_EQ(file.metadata().at("step"), "7");
  // The buffer starts 8-byte aligned (the mapping is page aligned).
  EXPECT_EQ(reinterpret_cast<uintptr_t>(file.entries()[0].bytes.data()) % 8, 0u);
  ASSERT_EQ(file.entries().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    // Written in the order given, so buffer order is that order.
    EXPECT_EQ(file.entries()[i].name, tensors[i].first);
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor read, file.Tensor(tensors[i].first));
    EXPECT_EQ(read.scalar_type(), tensors[i].second.scalar_type()) << tensors[i].first;
    EXPECT_EQ(read.sizes(), tensors[i].second.sizes()) << tensors[i].first;
    EXPECT_TRUE(at::equal(read, tensors[i].second)) << tensors[i].first;
  }
  EXPECT_EQ(file.Tensor("nope").status().code(), absl::StatusCode::kNotFound);
}

// Note [Safetensors header text]: the header written straight is the text DumpJson wrote of the
// same header as an nlohmann value, names needing escapes and metadata included; the pieces are
// the serialized bytes.
TEST(SafetensorsTest, HeaderTextIsTheJsonValuesDump) {
  const NamedTensors tensors = {{"zeta", at::arange(6, at::kFloat).reshape({2, 3}).t()},
                                {"a \"quoted\" \\ name", at::ones({4}, at::kBFloat16)},
                                {"caf\xc3\xa9/\x01", at::zeros({0, 2}, at::kLong)},
                                {"_", at::ones({2}, at::kBool)},
                                {"Z", at::zeros({}, at::kDouble)}};
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"why \"\n", "\t"}};
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const std::string bytes, SerializeSafetensors(tensors, metadata));
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  std::string header = bytes.substr(8, header_size);
  while (!header.empty() && header.back() == ' ') header.pop_back();
  nlohmann::json expected = nlohmann::json::object();
  expected["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const uint64_t size = tensor.numel() * tensor.element_size();
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const std::string dtype,
                                  SafetensorsDtypeName(tensor.scalar_type()));
    expected[name] = nlohmann::json{{"dtype", dtype},
                                    {"shape", tensor.sizes().vec()},
                                    {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  EXPECT_EQ(header, DumpJson(expected));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const SafetensorsPieces pieces,
                                SafetensorsPieces::Make(tensors, metadata));
  std::string joined;
  for (absl::string_view piece : pieces.pieces()) joined.append(piece.data(), piece.size());
  EXPECT_EQ(joined, bytes);
  EXPECT_EQ(pieces.size(), bytes.size());
}

TEST(SafetensorsTest, ReadsAFileWrittenFromTheSpecification) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(SafetensorsFile file,
                                SafetensorsFile::Open("numerics/testdata/mixed.safetensors"));
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.entries().size(), 11u);
  std::map<std::string, at::Tensor> read;
  for (const SafetensorsEntry& entry : file.entries()) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(read[entry.name], file.Tensor(entry.name));
  }
  auto tensor = [&](const char* name) { return read.at(name); };
  EXPECT_TRUE(at::equal(tensor("f32"),
                        at::tensor({1.5f, -2.0f, 0.25f, 3.0f, -0.0f, 1e-3f}).reshape({2, 3})));
  EXPECT_EQ(tensor("f64_scalar").dim(), 0);
  EXPECT_EQ(tensor("f64_scalar").item<double>(), 3.141592653589793);
  EXPECT_TRUE(at::equal(tensor("bf16"), at::tensor({1.5f, -2.0f, 0.25f, 3.0f}).to(at::kBFloat16)));
  EXPECT_TRUE(
      at::equal(tensor("f16").to(at::kFloat),
                at::tensor({0.5f, -1.0f, 65504.0f, 5.9604644775390625e-08f}).reshape({2, 2})));
  EXPECT_TRUE(at::equal(tensor("i64"), at::tensor(std::vector<int64_t>{-(int64_t{1} << 62), 0,
                                                                       (int64_t{1} << 53) + 1})));
  EXPECT_TRUE(at::equal(tensor("i32"), at::tensor(std::vector<int32_t>{-7, 2147483647})));
  EXPECT_TRUE(at::equal(tensor("i16"), at::tensor({-300, 300}).to(at::kShort)));
  EXPECT_TRUE(at::equal(tensor("i8"), at::tensor({-128, 127}).to(at::kChar)));
  EXPECT_TRUE(at::equal(tensor("u8"), at::tensor({0, 128, 255}).to(at::kByte)));
  EXPECT_TRUE(at::equal(tensor("flags"), at::tensor({1, 0, 0, 1}).to(at::kBool).reshape({2, 2})));
  EXPECT_EQ(tensor("empty").sizes(), (std::vector<int64_t>{0, 4}));
}

// A file of the given header text and buffer.
std::string File(const std::string& header, const std::string& buffer) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + buffer;
}

void ExpectRefused(const std::string& bytes, const std::string& message) {
  const absl::Status s = SafetensorsFile::FromBytes(bytes, "hostile.safetensors").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message;
  EXPECT_THAT(s.message(), HasSubstr("hostile.safetensors: not a valid safetensors file"));
  EXPECT_THAT(s.message(), HasSubstr(message));
}

TEST(SafetensorsTest, HostileFilesAreRefusedNamingWhatIsWrong) {
  const std::string eight(8, 'x');
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_TRUE(SafetensorsFile::FromBytes(File(good, eight), "good").ok());

  ExpectRefused("", "0 bytes, fewer than the 8 of the length");
  ExpectRefused(File(good, eight).substr(0, 20), "exceeds the 12 bytes after the length");
  std::string huge(8, '\xff');
  ExpectRefused(huge + "{}", "exceeds the format's limit");
  ExpectRefused(File("{\"a\":", eight), "not valid JSON");
  ExpectRefused(File("[1,2]", ""), "not a JSON object");
  ExpectRefused(File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                     eight),
                "key 'a' appears twice");
  ExpectRefused(
      File(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", eight),
      "key 'dtype' appears twice");
  // Nesting past the JSON reader's limit (200 KB of brackets overflowed the stack once).
  ExpectRefused(File(std::string(100000, '[') + std::string(100000, ']'), ""),
                "nested deeper than 64 levels");
  ExpectRefused(File(R"({"a":{"dtype":"F32","shape":[2]}})", eight), "exactly dtype, shape");
  ExpectRefused(File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", eight),
                "exactly dtype, shape");
  ExpectRefused(File(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", eight),
                "dtype 'Q7' is not one this LibTorch reads");
  ExpectRefused(File(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
                "shape[0] is -2, not a non-negative integer");
  ExpectRefused(File(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", eight),
                "not a non-negative integer");
  ExpectRefused(
      File(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", eight),
      "overflows 64 bits");
  ExpectRefused(File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,9]}})", eight),
                "not a range inside the 8-byte buffer");
  ExpectRefused(File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", eight),
                "not a range inside");
  ExpectRefused(
      File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}})", eight),
      "not a range inside");
  ExpectRefused(File(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
                "needs 12");
  // Overlap, hole, and a buffer only partly covered.
  ExpectRefused(File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                     eight),
                "overlapping the tensor before it");
  ExpectRefused(File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight),
                "leaving a hole");
  ExpectRefused(File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight),
                "the tensors cover 4 of the 8 buffer bytes");
  ExpectRefused(File(R"({"b":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})",
                     std::string("\x01\x02", 2)),
                "bool element 1 is byte 2");
  ExpectRefused(File(R"({"__metadata__":{"k":3}})", ""), "metadata 'k' is not a string");
  ExpectRefused(File(R"({"":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})", ""), "empty name");
}

TEST(SafetensorsTest, EveryCutOfAValidFileIsRefusedOrReadsWithinItsBytes) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      const std::string bytes,
      SerializeSafetensors({{"w", at::arange(10, at::kFloat)}, {"b", at::ones({3}, at::kDouble)}}));
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(SafetensorsFile::FromBytes(bytes.substr(0, n), "cut").ok()) << n;
  }
  EXPECT_TRUE(SafetensorsFile::FromBytes(bytes, "whole").ok());
}

TEST(SafetensorsTest, WritingRefusesWhatTheFormatCannotHold) {
  EXPECT_THAT(SerializeSafetensors({{"a", at::ones({1})}, {"a", at::ones({1})}}).status().message(),
              HasSubstr("given twice"));
  EXPECT_FALSE(SerializeSafetensors({{"__metadata__", at::ones({1})}}).ok());
  EXPECT_THAT(SerializeSafetensors({{"c", at::ones({1}, at::kComplexFloat)}}).status().message(),
              HasSubstr("has no safetensors name"));
  EXPECT_THAT(
      SerializeSafetensors({{std::string("\xff\xfe", 2), at::ones({1})}}).status().message(),
      HasSubstr("the tensor name '\\xff\\xfe' is not UTF-8"));
  EXPECT_THAT(SerializeSafetensors({{"a", at::ones({1})}}, {{"k", std::string("\xc3", 1)}})
                  .status()
                  .message(),
              HasSubstr("metadata 'k''s value '\\xc3' is not UTF-8"));
  const absl::Status unwritable =
      WriteSafetensors("/nonexistent-dir/x.safetensors", {{"a", at::ones({1})}});
  EXPECT_EQ(unwritable.code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace numerics
}  // namespace lockstep
