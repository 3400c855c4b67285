#include "numerics/inventory.h"

#include <algorithm>
#include <map>
#include <set>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace lockstep {
namespace numerics {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<Inventory> Inventory::Seal(std::vector<InventoryEntry> entries) {
  std::sort(entries.begin(), entries.end(),
            [](const InventoryEntry& a, const InventoryEntry& b) { return a.name < b.name; });
  std::vector<std::pair<std::string, Digest128>> named;
  named.reserve(entries.size());
  for (const InventoryEntry& e : entries) named.emplace_back(e.name, e.digest);
  Inventory inventory;
  LOCKSTEP_ASSIGN_OR_RETURN(inventory.state_digest_, StateDigest(std::move(named)));
  inventory.entries_ = std::move(entries);
  return inventory;
}

absl::StatusOr<Inventory> Inventory::Of(const NamedTensors& tensors) {
  std::vector<InventoryEntry> entries;
  entries.reserve(tensors.size());
  std::vector<at::Tensor> all;
  all.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    if (!tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is undefined"));
    }
    InventoryEntry entry;
    entry.name = name;
    LOCKSTEP_ASSIGN_OR_RETURN(entry.dtype, SafetensorsDtypeName(tensor.scalar_type()));
    entry.shape = tensor.sizes().vec();
    entry.strides = tensor.strides().vec();
    entry.device = tensor.device().str();
    entry.bytes = tensor.numel() * static_cast<int64_t>(tensor.element_size());
    entries.push_back(std::move(entry));
    all.push_back(tensor);
  }
  // All together (Note [Batched digests] in digest.cc).
  absl::StatusOr<std::vector<Digest128>> digests = DigestTensors(all);
  if (!digests.ok()) return Annotate(digests.status(), "while digesting the inventory's tensors");
  for (size_t i = 0; i < entries.size(); ++i) entries[i].digest = (*digests)[i];
  return Seal(std::move(entries));
}

absl::StatusOr<Inventory> Inventory::OfFile(const SafetensorsFile& file) {
  std::vector<InventoryEntry> entries;
  for (const SafetensorsEntry& e : file.entries()) {
    InventoryEntry entry;
    entry.name = e.name;
    LOCKSTEP_ASSIGN_OR_RETURN(entry.dtype, SafetensorsDtypeName(e.dtype));
    entry.shape = e.shape;
    entry.strides.assign(e.shape.size(), 1);
    for (int64_t d = static_cast<int64_t>(e.shape.size()) - 2; d >= 0; --d) {
      entry.strides[d] = entry.strides[d + 1] * std::max<int64_t>(e.shape[d + 1], 1);
    }
    entry.device = "file";
    entry.bytes = static_cast<int64_t>(e.bytes.size());
    entry.digest = TensorBytesDigest(entry.dtype, e.shape, e.bytes);
    entries.push_back(std::move(entry));
  }
  // Digests of a file rewritten meanwhile would describe neither version.
  LOCKSTEP_RETURN_IF_ERROR(file.CheckUnchanged());
  return Seal(std::move(entries));
}

int64_t Inventory::total_bytes() const {
  int64_t total = 0;
  for (const InventoryEntry& e : entries_) total += e.bytes;
  return total;
}

std::vector<InventoryDifference> CompareInventories(const Inventory& a, const Inventory& b) {
  std::vector<InventoryDifference> out;
  if (a.state_digest() == b.state_digest()) return out;
  std::map<std::string, const InventoryEntry*> in_b;
  for (const InventoryEntry& e : b.entries()) in_b[e.name] = &e;
  std::set<std::string> seen;
  for (const InventoryEntry& e : a.entries()) {
    seen.insert(e.name);
    auto other = in_b.find(e.name);
    if (other == in_b.end()) {
      out.push_back({e.name, "only in A"});
    } else if (e.dtype != other->second->dtype) {
      out.push_back({e.name, absl::StrCat("dtype ", e.dtype, " vs ", other->second->dtype)});
    } else if (e.shape != other->second->shape) {
      out.push_back({e.name, absl::StrCat("shape ", ShapeText(e.shape), " vs ",
                                          ShapeText(other->second->shape))});
    } else if (e.digest != other->second->digest) {
      out.push_back({e.name, absl::StrCat("digest ", DigestHex128(e.digest), " vs ",
                                          DigestHex128(other->second->digest))});
    }
  }
  for (const InventoryEntry& e : b.entries()) {
    if (!seen.count(e.name)) out.push_back({e.name, "only in B"});
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& x, const auto& y) { return x.name < y.name; });
  return out;
}

nlohmann::json InventoryJson(const Inventory& inventory) {
  nlohmann::json entries = nlohmann::json::array();
  for (const InventoryEntry& e : inventory.entries()) {
    entries.push_back({{"name", e.name},
                       {"dtype", e.dtype},
                       {"shape", e.shape},
                       {"strides", e.strides},
                       {"device", e.device},
                       {"bytes", e.bytes},
                       {"digest", DigestHex128(e.digest)}});
  }
  return {{"digest_version", 1},
          {"state_digest", DigestHex128(inventory.state_digest())},
          {"tensors", inventory.entries().size()},
          {"bytes", inventory.total_bytes()},
          {"entries", entries}};
}

}  // namespace numerics
}  // namespace lockstep
