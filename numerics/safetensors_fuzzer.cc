// Fuzz target (base/fuzz_target.h) for the safetensors reader on arbitrary bytes.
//
// Oracle: FromBytes returns kInvalidArgument or a file; an accepted file's entries lie inside
// the input, each holds exactly its shape's bytes, every tensor can be read, the file's
// inventory can be taken, and writing its tensors and metadata back gives a file that reads as
// the same entries with the same bytes.

#include <cstdint>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/fuzz_target.h"
#include "base/json.h"
#include "numerics/inventory.h"
#include "numerics/safetensors.h"

namespace lockstep {

namespace {

// A file of `header` (JSON text) and `buffer`, as the format lays them out.
std::string Raw(const std::string& header, const std::string& buffer) {
  const uint64_t size = header.size();
  std::string bytes(reinterpret_cast<const char*>(&size), 8);
  return bytes + header + buffer;
}

}  // namespace

std::vector<std::string> FuzzSeeds() {
  at::manual_seed(9);
  std::vector<std::string> seeds;
  const std::vector<numerics::NamedTensors> sets = {
      {{"w", at::randn({3, 2})}, {"b", at::arange(4, at::kLong)}},
      {{"h", at::randn({5}).to(at::kHalf)},
       {"bf", at::randn({2, 2}).to(at::kBFloat16)},
       {"flag", at::ones({3}, at::kBool)},
       {"empty", at::empty({0})},
       {"s", at::scalar_tensor(1.0)}},
  };
  for (const numerics::NamedTensors& set : sets) {
    absl::StatusOr<std::string> bytes = numerics::SerializeSafetensors(set, {{"k", "v"}});
    LOCKSTEP_FUZZ_CHECK(bytes.ok(), bytes.status().ToString());
    seeds.push_back(*bytes);
  }
  // Many tensors: the header's size and count limits are reached by mutating this one.
  numerics::NamedTensors many;
  for (int i = 0; i < 2000; ++i) {
    many.emplace_back(absl::StrCat("layers.", i, ".w"), at::full({1 + i % 3}, i % 256, at::kByte));
  }
  absl::StatusOr<std::string> bytes = numerics::SerializeSafetensors(many, {{"step", "7"}});
  LOCKSTEP_FUZZ_CHECK(bytes.ok(), bytes.status().ToString());
  seeds.push_back(*bytes);
  // Nesting at the JSON reader's limit and one past it, where a shape and the metadata are.
  for (const int depth : {kMaxJsonDepth - 2, kMaxJsonDepth + 1}) {
    std::string open, close;
    for (int i = 0; i < depth; ++i) {
      open += "[";
      close += "]";
    }
    seeds.push_back(Raw(absl::StrCat(R"({"w":{"dtype":"U8","shape":)", open, "1", close,
                                     R"(,"data_offsets":[0,1]}})"),
                        "\x01"));
    seeds.push_back(
        Raw(absl::StrCat(R"({"__metadata__":{"k":)", open, close, R"(},"w":{"dtype":"U8",)",
                         R"("shape":[1],"data_offsets":[0,1]}})"),
            "\x01"));
  }
  return seeds;
}

}  // namespace lockstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace numerics = lockstep::numerics;
  const std::string input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<numerics::SafetensorsFile> file =
      numerics::SafetensorsFile::FromBytes(input, "fuzz");
  if (!file.ok()) {
    LOCKSTEP_FUZZ_CHECK(file.status().code() == absl::StatusCode::kInvalidArgument,
                        file.status().ToString());
    return 0;
  }
  for (const numerics::SafetensorsEntry& e : file->entries()) {
    int64_t elements = 1;
    for (int64_t d : e.shape) elements *= d;
    LOCKSTEP_FUZZ_CHECK(static_cast<int64_t>(e.bytes.size()) ==
                            elements * static_cast<int64_t>(c10::elementSize(e.dtype)),
                        absl::StrCat("entry ", e.name, " holds the wrong byte count"));
  }
  absl::StatusOr<numerics::NamedTensors> tensors = file->Tensors();
  LOCKSTEP_FUZZ_CHECK(tensors.ok(), tensors.status().ToString());
  absl::StatusOr<numerics::Inventory> inventory = numerics::Inventory::OfFile(*file);
  LOCKSTEP_FUZZ_CHECK(inventory.ok(), inventory.status().ToString());
  absl::StatusOr<std::string> again = numerics::SerializeSafetensors(*tensors, file->metadata());
  LOCKSTEP_FUZZ_CHECK(again.ok(), again.status().ToString());
  absl::StatusOr<numerics::SafetensorsFile> reread =
      numerics::SafetensorsFile::FromBytes(*again, "again");
  LOCKSTEP_FUZZ_CHECK(reread.ok(), reread.status().ToString());
  LOCKSTEP_FUZZ_CHECK(reread->entries().size() == file->entries().size(), "entries lost");
  absl::StatusOr<numerics::Inventory> reread_inventory = numerics::Inventory::OfFile(*reread);
  LOCKSTEP_FUZZ_CHECK(
      reread_inventory.ok() && reread_inventory->state_digest() == inventory->state_digest(),
      "the rewritten file holds another state");
  return 0;
}
