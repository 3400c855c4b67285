#include "examples/lm/corpus.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace examples {
namespace {

// SplitMix64: a fixed function of the step and the index, not of any generator's state.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

absl::StatusOr<Corpus> Corpus::Load(const std::string& path, int64_t max_length) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("corpus ", path, " cannot be read"));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (static_cast<int64_t>(bytes.str().size()) < 4 * max_length) {
    return absl::InvalidArgumentError(absl::StrCat("corpus ", path, " has ", bytes.str().size(),
                                                   " bytes; it needs at least ", 4 * max_length));
  }
  return Corpus(bytes.str(), max_length);
}

std::vector<Sequence> Corpus::GlobalBatch(int64_t step, int count) const {
  std::vector<Sequence> batch;
  for (int i = 0; i < count; ++i) {
    const uint64_t h = Mix(static_cast<uint64_t>(step) * 7919 + static_cast<uint64_t>(i));
    int64_t length = 2 + static_cast<int64_t>(h % static_cast<uint64_t>(max_length_ - 1));
    // Every fourth step ends with two sequences of the whole budget and two of a single token, so
    // that (packed in order, under a budget of max_length) each DP worker of two gets a
    // microbatch of one token, which leaves CP ranks empty.
    if (step % 4 == 3 && count >= 4 && i >= count - 4) length = i < count - 2 ? max_length_ : 1;
    const int64_t start = static_cast<int64_t>((h >> 16) % static_cast<uint64_t>(size() - length));
    Sequence s;
    s.id = step * count + i;
    for (int64_t t = 0; t < length; ++t) {
      s.tokens.push_back(static_cast<unsigned char>(bytes_[start + t]));
    }
    batch.push_back(std::move(s));
  }
  return batch;
}

std::vector<Sequence> Corpus::DpBatch(int64_t step, int count, int dp_rank, int dp_size) const {
  std::vector<Sequence> global = GlobalBatch(step, count), mine;
  for (size_t i = dp_rank; i < global.size(); i += dp_size) mine.push_back(std::move(global[i]));
  return mine;
}

}  // namespace examples
}  // namespace lockstep
