// numerics/inventory.h
//
// An inventory proves what state an actor holds: every tensor of a set (a model's parameters and
// buffers, an optimizer state, a safetensors file) with its name, dtype, shape, strides, device,
// byte count and tensor digest, and one state digest over all of them (numerics/digest.h,
// numerics/DIGEST.md): equal for two actors that loaded the same state, whatever their memory
// layout, device or registration order. Two inventories compare entry by entry.
//
// Thread-safety: values; building one hashes on LibTorch's intra-op threads or the device.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(numerics::Inventory mine, numerics::Inventory::Of(state));
//   std::cout << numerics::DigestHex128(mine.state_digest());

#ifndef LOCKSTEP_NUMERICS_INVENTORY_H_
#define LOCKSTEP_NUMERICS_INVENTORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"
#include "numerics/digest.h"
#include "numerics/named_tensors.h"
#include "numerics/safetensors.h"

namespace lockstep {
namespace numerics {

// One tensor of an inventory.
struct InventoryEntry {
  std::string name;              // its name in the set (or the file)
  std::string dtype;             // the safetensors name ("F32", "BF16", ...)
  std::vector<int64_t> shape;    // its size along each dimension
  std::vector<int64_t> strides;  // in elements, as held (a file's are contiguous)
  std::string device;            // "cpu", "cuda:0"; a file's are "file"
  int64_t bytes = 0;             // logical bytes (elements x element size)
  Digest128 digest{};            // its tensor digest (numerics/digest.h)
};

// The inventory of a set of tensors (see the top of this file): its entries and its state digest.
class Inventory {
 public:
  // The inventory of `tensors`. kInvalidArgument for a duplicate name, an undefined tensor or a
  // dtype without a safetensors name.
  static absl::StatusOr<Inventory> Of(const NamedTensors& tensors);
  // The inventory of a file's tensors, hashed from its mapping without copying them.
  static absl::StatusOr<Inventory> OfFile(const SafetensorsFile& file);

  // Sorted by name (bytewise).
  const std::vector<InventoryEntry>& entries() const { return entries_; }
  // The state digest over the entries' names and tensor digests (DIGEST.md, "A state").
  const Digest128& state_digest() const { return state_digest_; }
  // The sum of the entries' logical bytes.
  int64_t total_bytes() const;

 private:
  static absl::StatusOr<Inventory> Seal(std::vector<InventoryEntry> entries);

  std::vector<InventoryEntry> entries_;
  Digest128 state_digest_{};
};

// One way two inventories differ: a name in only one, or a differing dtype, shape or digest.
struct InventoryDifference {
  std::string name;  // the tensor's name
  std::string what;  // "only in A", "dtype F32 vs F16", "shape [2] vs [3]", "digest 1f.. vs 9c.."
};

// Every difference, by name; empty when the state digests are equal. Strides and devices are not
// differences (the digest ignores layout).
std::vector<InventoryDifference> CompareInventories(const Inventory& a, const Inventory& b);

// {"state_digest", "tensors": N, "bytes", "digest_version": 1, "entries": [{name, dtype, shape,
// strides, device, bytes, digest}]}.
nlohmann::json InventoryJson(const Inventory& inventory);

}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_INVENTORY_H_
