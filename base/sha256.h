// base/sha256.h
//
// SHA-256 (OpenSSL's libcrypto) over a sequence of parts, each framed by its 8-byte
// little-endian length, so that ("ab", "c") and ("a", "bc") hash differently. Used wherever
// lockstep derives or compares state by digest: agreement checks, model-stream derivation.
//
// Sha256Hasher computes the same digests incrementally, for inputs too large to gather into one
// string first (e.g. a plan serialized block by block).
//
// Thread-safety: the functions are stateless; a Sha256Hasher is not thread-safe.
//
// Example:
//   Sha256Digest d = Sha256Framed({"lockstep/model-stream/v1", caller_state});

#ifndef LOCKSTEP_BASE_SHA256_H_
#define LOCKSTEP_BASE_SHA256_H_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/strings/string_view.h"

namespace lockstep {

// A SHA-256 digest: 32 bytes, in the order the algorithm outputs them.
using Sha256Digest = std::array<uint8_t, 32>;

// The digest of `parts` in order, each framed by its length (8 bytes, little-endian) before its
// bytes; no part is ever read as a boundary of another.
Sha256Digest Sha256Framed(std::initializer_list<absl::string_view> parts);

// Incremental SHA-256. Sha256Framed({a, b}) equals the digest of
//   h.AppendLength(a.size()); h.Append(a); h.AppendLength(b.size()); h.Append(b); h.Finish();
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;

  // Hashes `bytes` as they are.
  void Append(absl::string_view bytes);
  // Hashes `length` as 8 little-endian bytes (the frame Sha256Framed puts before each part).
  void AppendLength(uint64_t length);
  // Hashes `part` framed as Sha256Framed frames each part: its length, then its bytes.
  void AppendFramed(absl::string_view part);
  // The digest of everything appended since construction or the previous Finish; the hasher then
  // starts over, as if new (so a second Finish gives the digest of nothing appended).
  Sha256Digest Finish();

 private:
  void Start();

  void* ctx_;             // EVP_MD_CTX, kept out of this header
  bool started_ = false;  // whether ctx_ holds a message begun (Append) and not finished
};

// Lowercase hex of the first `bytes` bytes of a digest.
std::string DigestHex(const Sha256Digest& digest, int bytes = 32);

// The 8 bytes of `digest` from kByteOffset on, as a little-endian integer. The offset is a
// template argument so that one outside the digest is a compile error, not a runtime failure.
template <int kByteOffset>
uint64_t DigestWord(const Sha256Digest& digest) {
  static_assert(kByteOffset >= 0 && kByteOffset + 8 <= 32, "DigestWord: offset in [0, 24]");
  uint64_t word = 0;
  for (int i = 0; i < 8; ++i) word |= static_cast<uint64_t>(digest[kByteOffset + i]) << (8 * i);
  return word;
}

}  // namespace lockstep

#endif  // LOCKSTEP_BASE_SHA256_H_
