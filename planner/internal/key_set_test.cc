// planner/internal/key_set: FindPrev against a std::set oracle over random inserts and erases,
// across the sizes where the summary levels change (64, 4096, 262144 keys).

#include "planner/internal/key_set.h"

#include <random>
#include <set>

#include "gtest/gtest.h"

namespace lockstep {
namespace planner {
namespace internal {
namespace {

int64_t OraclePrev(const std::set<int64_t>& keys, int64_t key) {
  auto it = keys.upper_bound(key);
  if (it == keys.begin()) return -1;
  return *std::prev(it);
}

TEST(KeySetTest, EmptySetHasNoPredecessor) {
  KeySet set(100);
  EXPECT_EQ(set.FindPrev(0), -1);
  EXPECT_EQ(set.FindPrev(99), -1);
}

TEST(KeySetTest, WordAndLevelBoundaries) {
  KeySet set(1 << 13);
  for (int64_t key : {0, 63, 64, 4095, 4096, 8191}) set.Insert(key);
  EXPECT_EQ(set.FindPrev(62), 0);
  EXPECT_EQ(set.FindPrev(63), 63);
  EXPECT_EQ(set.FindPrev(4094), 64);
  EXPECT_EQ(set.FindPrev(8190), 4096);
  EXPECT_EQ(set.FindPrev(8191), 8191);
  set.Erase(0);
  EXPECT_EQ(set.FindPrev(62), -1);
  set.Erase(4096);
  EXPECT_EQ(set.FindPrev(8190), 4095);
}

TEST(KeySetTest, MatchesAnOrderedSetUnderRandomUpdates) {
  std::mt19937_64 rng(20261130);
  for (int64_t size : {1, 64, 65, 4096, 4097, 262144}) {
    KeySet set(size);
    std::set<int64_t> oracle;
    std::uniform_int_distribution<int64_t> key(0, size - 1);
    for (int step = 0; step < 20000; ++step) {
      const int64_t k = key(rng);
      if (rng() % 3 == 0 && !oracle.empty()) {
        const int64_t victim = OraclePrev(oracle, k) >= 0 ? OraclePrev(oracle, k) : *oracle.begin();
        set.Erase(victim);
        oracle.erase(victim);
      } else {
        set.Insert(k);
        oracle.insert(k);
      }
      const int64_t query = key(rng);
      ASSERT_EQ(set.FindPrev(query), OraclePrev(oracle, query))
          << "size " << size << ", step " << step << ", query " << query;
    }
  }
}

}  // namespace
}  // namespace internal
}  // namespace planner
}  // namespace lockstep
