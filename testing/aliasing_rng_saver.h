// testing/aliasing_rng_saver.h
//
// A deliberately wrong checkpoint::RngStateSaver, for negative controls: it "saves" the default
// CPU and CUDA generators by keeping handles to the live generators instead of copying their
// values — the aliasing bug of real checkpoint implementations. Its Restore() writes the
// generators' current state back into themselves, so a recompute does not rewind and draws
// different masks than the forward did. Tests and `qualify --negative-control
// aliasing-snapshot` use it to prove that their checks catch that bug. Never use it otherwise.

#ifndef LOCKSTEP_TESTING_ALIASING_RNG_SAVER_H_
#define LOCKSTEP_TESTING_ALIASING_RNG_SAVER_H_

#include <memory>

#include "checkpoint/rng_state_saver.h"
#include "rng/generator_state.h"

namespace lockstep {
namespace testing {

class AliasingRngSaver : public checkpoint::RngStateSaver {
 public:
  explicit AliasingRngSaver(rng::DefaultGenerators generators) : generators_(generators) {}
  absl::StatusOr<std::unique_ptr<checkpoint::SavedRngState>> Save() const override;

 private:
  rng::DefaultGenerators generators_;
};

}  // namespace testing
}  // namespace lockstep

#endif  // LOCKSTEP_TESTING_ALIASING_RNG_SAVER_H_
