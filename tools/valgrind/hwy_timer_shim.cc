// Preloaded under valgrind only (tools/fuzz.sh): libhwy, which LibTorch loads through libjxl,
// measures its timer resolution with rdtscp in a static initializer, an instruction valgrind
// 3.19 does not emulate (SIGILL before main). This stands in for that one exported function;
// nothing lockstep or LibTorch computes depends on it.

#include <cstdint>

namespace hwy {
namespace platform {

uint64_t TimerResolution() { return 1; }

}  // namespace platform
}  // namespace hwy
