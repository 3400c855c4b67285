// invariant/mode.h
//
// Placement-invariant mode: one process-wide switch under which lockstep's models compute each
// sequence's outputs and loss contribution with the kernels of invariant/ops.h, whose bits do not
// depend on where the sequence was placed (alone, packed with others, split by out-of-memory
// recovery, sharded over CP). Note [Placement invariance] in invariant/ops.h says what holds.
//
// The mode is a scope: it is on while any PlacementInvariantScope lives, and
// numerics::CaptureExecutionContext records it beside deterministic mode, so that two runs whose
// contexts agree ran with the same kernels.
//
//   {
//     invariant::PlacementInvariantScope invariant;
//     ... qualify's packing_invariance, the example's steps ...
//   }
//
// A model reads the switch when its forward starts (ModeOn) and keeps what it read for the
// backward of that forward (a recomputed block under activation checkpointing runs the forward's
// kernels, not the ones in force when backward runs).
//
// Thread-safety: scopes may be opened and closed from any thread; the mode is the process's.

#ifndef LOCKSTEP_INVARIANT_MODE_H_
#define LOCKSTEP_INVARIANT_MODE_H_

namespace lockstep {
namespace invariant {

// Whether placement-invariant mode is on (some PlacementInvariantScope is alive).
bool ModeOn();

// Turns the mode on for its lifetime. Scopes nest; the mode is off again once every scope has
// ended.
class PlacementInvariantScope {
 public:
  PlacementInvariantScope();
  ~PlacementInvariantScope();
  PlacementInvariantScope(const PlacementInvariantScope&) = delete;
  PlacementInvariantScope& operator=(const PlacementInvariantScope&) = delete;
};

}  // namespace invariant
}  // namespace lockstep

#endif  // LOCKSTEP_INVARIANT_MODE_H_
