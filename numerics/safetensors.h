// numerics/safetensors.h
//
// The safetensors format (a little-endian u64 header length, a JSON header naming each tensor's
// dtype, shape and [begin, end) byte range in the buffer that follows, an optional
// "__metadata__" object of strings), read strictly and written atomically.
//
// Reading maps the file (base/file_io.h) and validates all of the header before anything is
// returned: the length within the file and within kMaxSafetensorsHeaderBytes; JSON that is one
// object, with no duplicate key at any level; per tensor exactly the keys dtype, shape and
// data_offsets; a dtype this LibTorch has; non-negative dimensions whose element count and byte
// size do not overflow; ranges that match that size and together tile the buffer from 0 to its
// end with no hole or overlap (as the format requires); bool bytes 0 or 1. A corrupt or hostile
// file gets kInvalidArgument naming the file, the tensor and the value, and nothing past the
// mapping is ever read. Entries are found by name in constant time (a header may name millions).
// A file that changes while it is read (truncated or rewritten in place) is kAborted naming it,
// never a crash (base/file_io.h).
//
// Writing takes CPU or CUDA tensors in any layout and stores their logical contiguous bytes
// (little-endian), in the order given, with the header padded by spaces to a multiple of 8 bytes
// so that the buffer starts 8-byte aligned (the format forbids gaps between tensors, so later
// tensors are aligned only as their predecessors' sizes allow).
//
// Thread-safety: a SafetensorsFile is immutable once opened.
//
// Example:
//   LOCKSTEP_RETURN_IF_ERROR(numerics::WriteSafetensors("state.safetensors", {{"w", weight}}));
//   LOCKSTEP_ASSIGN_OR_RETURN(numerics::SafetensorsFile file,
//                             numerics::SafetensorsFile::Open("state.safetensors"));
//   LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor w, file.Tensor("w"));

#ifndef LOCKSTEP_NUMERICS_SAFETENSORS_H_
#define LOCKSTEP_NUMERICS_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/file_io.h"
#include "numerics/named_tensors.h"

namespace lockstep {
namespace numerics {

// The format's limit on the JSON header.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// The safetensors name of a LibTorch dtype ("F32", "BF16", ...). kInvalidArgument naming the
// dtype for one the format or this LibTorch does not have.
absl::StatusOr<std::string> SafetensorsDtypeName(at::ScalarType dtype);
// The LibTorch dtype of a safetensors dtype name: SafetensorsDtypeName's inverse.
// kInvalidArgument naming it, and the names this LibTorch reads, for any other name.
absl::StatusOr<at::ScalarType> SafetensorsDtype(absl::string_view name);

// One tensor of a file: where its bytes are, without copying them.
struct SafetensorsEntry {
  std::string name;                   // its key in the header
  at::ScalarType dtype = at::kFloat;  // LibTorch's dtype for the header's dtype name
  std::vector<int64_t> shape;         // its size along each dimension (each >= 0)
  // The tensor's logical contiguous bytes, inside the file's mapping (valid while the
  // SafetensorsFile or a copy of it lives).
  absl::string_view bytes;
};

// A safetensors file (or bytes in its format), validated (see the top of this file): its
// entries, found by name, and its metadata. A copy shares the mapped or owned bytes.
class SafetensorsFile {
 public:
  // Maps and validates `path` (see the top of this file).
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);
  // Validates `bytes` as a file's contents; `what` names it in errors.
  static absl::StatusOr<SafetensorsFile> FromBytes(std::string bytes, std::string what);

  // What names it in errors: the path given to Open, or FromBytes' `what`.
  const std::string& what() const { return what_; }
  // The whole file's bytes as read (for Open, the mapping the entries point into): what a
  // caller hashes is then exactly what it reads.
  absl::string_view bytes() const { return bytes_; }
  // Every tensor, in buffer order.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  // The header's "__metadata__" object, key to value (empty without one).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The entry named `name`, or null.
  const SafetensorsEntry* Find(absl::string_view name) const;

  // A CPU tensor with a copy of the entry's bytes. kNotFound for an unknown name.
  absl::StatusOr<at::Tensor> Tensor(absl::string_view name) const;
  // Every tensor, copied, in buffer order.
  absl::StatusOr<NamedTensors> Tensors() const;

  // OK unless the file changed while it was read (MappedFile::CheckUnchanged: kAborted naming
  // it). Tensor, Tensors and Open check it themselves; a caller reading entries' bytes directly
  // checks it once it has read them.
  absl::Status CheckUnchanged() const;

 private:
  SafetensorsFile() = default;
  static absl::StatusOr<SafetensorsFile> Parse(std::shared_ptr<const void> owner,
                                               absl::string_view bytes, std::string what);
  // A CPU tensor with a copy of `entry`'s bytes.
  absl::StatusOr<at::Tensor> Copy(const SafetensorsEntry& entry) const;

  std::string what_;
  std::shared_ptr<const void> owner_;              // keeps the mapped or owned bytes alive
  absl::string_view bytes_;                        // the whole file, inside owner_
  std::shared_ptr<const MappedFile> mapped_;       // the mapping, for a file that was opened
  std::unordered_map<std::string, size_t> index_;  // name -> position in entries_
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// A safetensors file's bytes as pieces: its length and header, then each tensor's contiguous CPU
// bytes where they lie, so that a writer (WriteSafetensors, a state capture) writes and hashes
// them without first copying them into one buffer. Holds the tensors (a CUDA tensor's CPU copy,
// a strided one's contiguous copy), so the pieces stay valid while it lives.
class SafetensorsPieces {
 public:
  // Errors as SerializeSafetensors's.
  static absl::StatusOr<SafetensorsPieces> Make(
      const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});
  // The file's bytes, in order: views into this object, valid while it lives unmoved.
  std::vector<absl::string_view> pieces() const;
  // The file's size in bytes.
  uint64_t size() const { return prefix_.size() + buffer_bytes_; }

 private:
  SafetensorsPieces() = default;
  std::string prefix_;              // the u64 header length, then the header padded to 8 bytes
  std::vector<at::Tensor> buffer_;  // each tensor's bytes, contiguous on the CPU, in file order
  uint64_t buffer_bytes_ = 0;
};

// The bytes of a safetensors file holding `tensors` (in that order) and `metadata`.
// kInvalidArgument for an empty or duplicate name, a name "__metadata__", or a dtype the format
// lacks; a tensor on another device is copied to the CPU first.
absl::StatusOr<std::string> SerializeSafetensors(
    const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});

// SerializeSafetensors written to `path` atomically (base/file_io.h), from SafetensorsPieces.
absl::Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_SAFETENSORS_H_
