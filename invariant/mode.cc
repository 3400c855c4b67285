#include "invariant/mode.h"

#include <atomic>

namespace lockstep {
namespace invariant {
namespace {

std::atomic<int> open_scopes{0};

}  // namespace

bool ModeOn() { return open_scopes.load(std::memory_order_acquire) > 0; }

PlacementInvariantScope::PlacementInvariantScope() {
  open_scopes.fetch_add(1, std::memory_order_acq_rel);
}

PlacementInvariantScope::~PlacementInvariantScope() {
  open_scopes.fetch_sub(1, std::memory_order_acq_rel);
}

}  // namespace invariant
}  // namespace lockstep
