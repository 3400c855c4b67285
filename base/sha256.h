// base/sha256.h
//
// SHA-256 (OpenSSL's libcrypto) over a sequence of parts, each framed by its 8-byte
// little-endian length, so that ("ab", "c") and ("a", "bc") hash differently. Used wherever
// lockstep derives or compares state by digest: agreement checks, model-stream derivation.
//
// Thread-safety: stateless.
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

using Sha256Digest = std::array<uint8_t, 32>;

Sha256Digest Sha256Framed(std::initializer_list<absl::string_view> parts);

// Lowercase hex of the first `bytes` bytes of a digest.
std::string DigestHex(const Sha256Digest& digest, int bytes = 32);

// The first 8 bytes of `digest` from `byte_offset` on, as a little-endian integer.
uint64_t DigestWord(const Sha256Digest& digest, int byte_offset);

}  // namespace lockstep

#endif  // LOCKSTEP_BASE_SHA256_H_
