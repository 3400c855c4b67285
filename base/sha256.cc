#include "base/sha256.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/escaping.h"

namespace lockstep {
namespace {

// A failed OpenSSL call (it fails only when OpenSSL cannot allocate its few bytes of context) is a
// broken invariant, not a condition a caller can cause. This file checks with
// its own abort instead of LOCKSTEP_CHECK so that //base:sha256 depends only on Abseil and
// OpenSSL: base/logging.h would add glog to every user, among them the planner core, which links
// neither glog nor LibTorch.
void Check(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "base/sha256: check failed: %s\n", what);
  std::abort();
}

// A context initialized for SHA-256 once, which every message starts from as a copy. Given
// EVP_sha256(), each EVP_DigestInit_ex fetches the algorithm again (a locked method-store query)
// and asks the ENGINE table for an implementation, which costs several times a small digest's own
// work on cold caches; fetched once and copied, a digest pays only for hashing (planner_benchmark
// times the plan digest).
const EVP_MD_CTX* Sha256Start() {
  static const EVP_MD_CTX* const start = [] {
    EVP_MD* algorithm = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    Check(algorithm != nullptr, "EVP_MD_fetch(SHA256)");
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    Check(ctx != nullptr, "EVP_MD_CTX_new");
    Check(EVP_DigestInit_ex(ctx, algorithm, nullptr) == 1, "EVP_DigestInit_ex");
    EVP_MD_free(algorithm);  // the context holds its own reference
    return ctx;
  }();
  return start;
}

}  // namespace

Sha256Hasher::Sha256Hasher() {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  Check(ctx != nullptr, "EVP_MD_CTX_new");
  ctx_ = ctx;  // started by the first Append or Finish
}

void Sha256Hasher::Start() {
  Check(EVP_MD_CTX_copy_ex(static_cast<EVP_MD_CTX*>(ctx_), Sha256Start()) == 1,
        "EVP_MD_CTX_copy_ex");
  started_ = true;
}

Sha256Hasher::~Sha256Hasher() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256Hasher::Append(absl::string_view bytes) {
  if (!started_) Start();
  Check(EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), bytes.data(), bytes.size()) == 1,
        "EVP_DigestUpdate");
}

void Sha256Hasher::AppendLength(uint64_t length) {
  char frame[8];
  for (int i = 0; i < 8; ++i) frame[i] = static_cast<char>(length >> (8 * i));
  Append(absl::string_view(frame, sizeof(frame)));
}

Sha256Digest Sha256Hasher::Finish() {
  if (!started_) Start();
  Sha256Digest digest;
  unsigned int length = 0;
  Check(EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest.data(), &length) == 1,
        "EVP_DigestFinal_ex");
  Check(length == digest.size(), "digest length");
  started_ = false;  // the next Append or Finish starts over (a one-shot hasher never does)
  return digest;
}

void Sha256Hasher::AppendFramed(absl::string_view part) {
  AppendLength(part.size());
  Append(part);
}

Sha256Digest Sha256Framed(std::initializer_list<absl::string_view> parts) {
  Sha256Hasher hasher;
  for (absl::string_view part : parts) hasher.AppendFramed(part);
  return hasher.Finish();
}

std::string DigestHex(const Sha256Digest& digest, int bytes) {
  bytes = std::min<int>(bytes, digest.size());
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest.data()), bytes));
}

}  // namespace lockstep
