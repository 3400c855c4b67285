// base/sha256: known-answer vectors, the length framing, and Sha256Hasher against Sha256Framed.

#include "base/sha256.h"

#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace lockstep {
namespace {

TEST(Sha256Test, KnownAnswer) {
  // FIPS 180-2 example: SHA-256("abc").
  Sha256Hasher hasher;
  hasher.Append("abc");
  EXPECT_EQ(DigestHex(hasher.Finish()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256Test, FramingSeparatesParts) {
  EXPECT_NE(Sha256Framed({"ab", "c"}), Sha256Framed({"a", "bc"}));
  EXPECT_NE(Sha256Framed({"abc"}), Sha256Framed({"abc", ""}));
}

TEST(Sha256Test, HasherInPiecesEqualsFramed) {
  const std::string big(100000, 'x');
  Sha256Hasher hasher;
  hasher.AppendLength(3);
  hasher.Append("tag");
  hasher.AppendLength(big.size());
  for (size_t at = 0; at < big.size(); at += 777) hasher.Append(big.substr(at, 777));
  EXPECT_EQ(hasher.Finish(), Sha256Framed({"tag", big}));
}

TEST(Sha256Test, DigestWordIsLittleEndian) {
  Sha256Digest d{};
  d[3] = 1;
  d[4] = 2;
  EXPECT_EQ(DigestWord<3>(d), 0x0201u);
  EXPECT_EQ(DigestWord<24>(d), 0u);
  EXPECT_EQ(DigestHex(d, 5), "0000000102");
}

TEST(Sha256Test, FinishStartsOver) {
  Sha256Hasher hasher;
  hasher.AppendFramed("first");
  EXPECT_EQ(hasher.Finish(), Sha256Framed({"first"}));
  // A second Finish is the digest of nothing appended, not a failure.
  EXPECT_EQ(hasher.Finish(), Sha256Framed({}));
  // Appending after Finish starts a new message.
  hasher.AppendFramed("second");
  EXPECT_EQ(hasher.Finish(), Sha256Framed({"second"}));
}

TEST(Sha256Test, ThreadsHashAtOnce) {
  // Every hasher starts from one shared, initialized context (copied, never written): threads
  // hashing at once each get the digests a lone thread gets.
  std::vector<Sha256Digest> expected;
  for (int i = 0; i < 200; ++i) expected.push_back(Sha256Framed({"part", std::to_string(i)}));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (int i = 0; i < 200; ++i) {
          Sha256Hasher hasher;
          hasher.AppendFramed("part");
          hasher.AppendFramed(std::to_string(i));
          if (hasher.Finish() != expected[i]) ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

}  // namespace
}  // namespace lockstep
