// examples/lm/corpus.h
//
// The example's data: a plain text file, as bytes (one token per byte), and the deterministic
// global batch of every training step — sequences of varied lengths cut from it, the same on
// every rank and in every layout, so that a run split over DP x TP x CP trains on exactly the
// data of an unsplit run, and a resumed run continues with the batches the uninterrupted one
// would have had. Each DP worker takes every dp_size-th sequence of the global batch (its
// DP-local batch: lockstep leaves DP partitioning to the caller).
//
// The lengths vary (short, long, and every fourth step two of the whole budget and two of a single
// token), so that
// the planner packs several sequences per microbatch, shards long ones over CP ranks, and leaves a
// CP rank empty now and then.
//
// Thread-safety: immutable after Load.

#ifndef LOCKSTEP_EXAMPLES_LM_CORPUS_H_
#define LOCKSTEP_EXAMPLES_LM_CORPUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lockstep {
namespace examples {

struct Sequence {
  int64_t id = 0;  // unique over the whole run: step x sequences per step + index
  std::vector<int64_t> tokens;
};

class Corpus {
 public:
  // The bytes of `path`. kNotFound naming it; kInvalidArgument if it has fewer than
  // 4 x max_length bytes.
  static absl::StatusOr<Corpus> Load(const std::string& path, int64_t max_length);

  // The global batch of step `step`: `count` sequences of 1..max_length tokens.
  std::vector<Sequence> GlobalBatch(int64_t step, int count) const;

  // This DP worker's part of it: sequences dp_rank, dp_rank + dp_size, ...
  std::vector<Sequence> DpBatch(int64_t step, int count, int dp_rank, int dp_size) const;

  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }

 private:
  Corpus(std::string bytes, int64_t max_length)
      : bytes_(std::move(bytes)), max_length_(max_length) {}
  std::string bytes_;
  int64_t max_length_;
};

}  // namespace examples
}  // namespace lockstep

#endif  // LOCKSTEP_EXAMPLES_LM_CORPUS_H_
