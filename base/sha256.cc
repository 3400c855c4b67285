#include "base/sha256.h"

#include <openssl/evp.h>

#include <algorithm>

#include "absl/strings/escaping.h"
#include "base/logging.h"

namespace lockstep {

Sha256Digest Sha256Framed(std::initializer_list<absl::string_view> parts) {
  Sha256Digest digest;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  CHECK(ctx != nullptr);
  CHECK_EQ(EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr), 1);
  for (absl::string_view part : parts) {
    const uint64_t length = part.size();
    uint8_t frame[8];
    for (int i = 0; i < 8; ++i) frame[i] = static_cast<uint8_t>(length >> (8 * i));
    CHECK_EQ(EVP_DigestUpdate(ctx, frame, sizeof(frame)), 1);
    CHECK_EQ(EVP_DigestUpdate(ctx, part.data(), part.size()), 1);
  }
  unsigned int length = 0;
  CHECK_EQ(EVP_DigestFinal_ex(ctx, digest.data(), &length), 1);
  CHECK_EQ(length, digest.size());
  EVP_MD_CTX_free(ctx);
  return digest;
}

std::string DigestHex(const Sha256Digest& digest, int bytes) {
  bytes = std::min<int>(bytes, digest.size());
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest.data()), bytes));
}

uint64_t DigestWord(const Sha256Digest& digest, int byte_offset) {
  CHECK(byte_offset >= 0 && byte_offset + 8 <= static_cast<int>(digest.size()));
  uint64_t word = 0;
  for (int i = 0; i < 8; ++i) word |= static_cast<uint64_t>(digest[byte_offset + i]) << (8 * i);
  return word;
}

}  // namespace lockstep
