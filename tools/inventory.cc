// inventory: every tensor of safetensors files with its dtype, shape, bytes and digest, and the
// file's state digest (numerics/DIGEST.md). With two files: whether they hold the same state,
// and if not, the entries that differ. JSON evidence with --out, including this run's execution
// context and, when two files both carry one, which context fields differ between them.
// Exit 0: one file, or two identical states; 1: two files that differ; 2: bad input.
//
//   inventory FILE.safetensors [OTHER.safetensors] [--out=inventory.json]

#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file_io.h"
#include "base/json.h"
#include "base/tool_flags.h"
#include "nlohmann/json.hpp"
#include "numerics/execution_context.h"
#include "numerics/inventory.h"
#include "numerics/safetensors.h"

ABSL_FLAG(lockstep::OutputPath, out, lockstep::OutputPath(),
          "where to write the JSON inventory (none when not given)");

namespace {

namespace numerics = lockstep::numerics;

int Fail(const absl::Status& status) {
  std::cerr << "inventory: " << status.message() << std::endl;
  return lockstep::kBadInputExitCode;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args = lockstep::ParseToolFlags(
      argc, argv,
      "inventory FILE [OTHER] [--out=FILE]: tensors, digests and the state digest of safetensors "
      "files; with two, whether they hold the same state. Exit 0 same (or one file), 1 differ, "
      "2 bad input.");
  if (args.empty() || args.size() > 2) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("expected one or two safetensors files, got ", args.size(), " arguments")));
  }
  std::vector<numerics::Inventory> inventories;
  std::vector<std::optional<nlohmann::json>> contexts;
  nlohmann::json files = nlohmann::json::array();
  for (const std::string& path : args) {
    absl::StatusOr<numerics::SafetensorsFile> file = numerics::SafetensorsFile::Open(path);
    if (!file.ok()) return Fail(file.status());
    absl::StatusOr<numerics::Inventory> inventory = numerics::Inventory::OfFile(*file);
    if (!inventory.ok()) return Fail(inventory.status());
    std::cout << path << ": " << inventory->entries().size() << " tensors, "
              << inventory->total_bytes() << " bytes, state digest "
              << numerics::DigestHex128(inventory->state_digest()) << "\n";
    for (const numerics::InventoryEntry& e : inventory->entries()) {
      std::cout << absl::StrFormat("  %-40s %-5s %-20s %12d %s\n", e.name, e.dtype,
                                   absl::StrCat("[", absl::StrJoin(e.shape, ", "), "]"), e.bytes,
                                   numerics::DigestHex128(e.digest));
    }
    nlohmann::json entry = numerics::InventoryJson(*inventory);
    entry["path"] = path;
    files.push_back(entry);
    contexts.push_back(numerics::ContextFromMetadata(file->metadata()));
    inventories.push_back(std::move(*inventory));
  }
  nlohmann::json evidence = {
      {"tool", "inventory"}, {"files", files}, {"context", numerics::CaptureExecutionContext()}};
  bool same = true;
  if (inventories.size() == 2) {
    const std::vector<numerics::InventoryDifference> differences =
        numerics::CompareInventories(inventories[0], inventories[1]);
    same = differences.empty();
    nlohmann::json listed = nlohmann::json::array();
    for (const auto& d : differences) listed.push_back({{"name", d.name}, {"what", d.what}});
    evidence["identical"] = same;
    evidence["differences"] = listed;
    std::cout << "\n" << (same ? "IDENTICAL" : "DIFFERENT") << " states";
    if (!same) std::cout << ": " << differences.size() << " entries differ";
    std::cout << "\n";
    for (const auto& d : differences) std::cout << "  " << d.name << ": " << d.what << "\n";
    if (contexts[0] && contexts[1]) {
      const std::vector<std::string> differ =
          numerics::ContextDifferences(*contexts[0], *contexts[1]);
      evidence["input_context_differences"] = differ;
      std::cout << "execution contexts of the inputs: "
                << (differ.empty() ? "identical" : "differ in " + absl::StrJoin(differ, ", "))
                << "\n";
    }
  }
  if (const std::string out = absl::GetFlag(FLAGS_out).path; !out.empty()) {
    if (absl::Status s = lockstep::WriteFileAtomically(out, lockstep::DumpJson(evidence, 2) + "\n");
        !s.ok()) {
      return Fail(s);
    }
  }
  return same ? 0 : 1;
}
