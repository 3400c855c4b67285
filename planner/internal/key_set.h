// planner/internal/key_set.h
//
// Private to planner/: KeySet, a set of keys in [0, size) answering "largest member <= k" in a
// few word operations — a bitset with summary levels (bit j of level l + 1 says whether word j
// of level l is non-zero). First-fit-decreasing packing asks it for the longest remaining
// sequence that fits a microbatch's room (Note [FFD by length buckets] in planner.cc).
//
// Thread-safety: not thread-safe.

#ifndef LOCKSTEP_PLANNER_INTERNAL_KEY_SET_H_
#define LOCKSTEP_PLANNER_INTERNAL_KEY_SET_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace lockstep {
namespace planner {
namespace internal {

class KeySet {
 public:
  // An empty set over the keys [0, size).
  explicit KeySet(int64_t size) {
    int64_t bits = std::max<int64_t>(size, 1);
    do {
      const int64_t words = (bits + 63) / 64;
      levels_.emplace_back(words, 0);
      bits = words;
    } while (bits > 1);
  }

  // Precondition for both: 0 <= key < size.
  void Insert(int64_t key) {
    for (auto& level : levels_) {
      level[key >> 6] |= uint64_t{1} << (key & 63);
      key >>= 6;
    }
  }
  void Erase(int64_t key) {
    for (auto& level : levels_) {
      uint64_t& word = level[key >> 6];
      word &= ~(uint64_t{1} << (key & 63));
      if (word != 0) return;
      key >>= 6;
    }
  }

  // The largest member <= key, or -1. Precondition: key < size.
  int64_t FindPrev(int64_t key) const {
    size_t level = 0;
    int64_t pos = key;
    while (true) {
      if (pos < 0) return -1;
      const int bit = static_cast<int>(pos & 63);
      const uint64_t mask = bit == 63 ? ~uint64_t{0} : (uint64_t{1} << (bit + 1)) - 1;
      const uint64_t word = levels_[level][pos >> 6] & mask;
      if (word != 0) {
        pos = (pos & ~int64_t{63}) + 63 - __builtin_clzll(word);
        break;
      }
      if (level + 1 == levels_.size()) return -1;
      pos = (pos >> 6) - 1;
      ++level;
    }
    while (level > 0) {
      --level;
      pos = pos * 64 + 63 - __builtin_clzll(levels_[level][pos]);
    }
    return pos;
  }

 private:
  std::vector<std::vector<uint64_t>> levels_;
};

}  // namespace internal
}  // namespace planner
}  // namespace lockstep

#endif  // LOCKSTEP_PLANNER_INTERNAL_KEY_SET_H_
