#include "base/fuzz_target.h"

#include <cstdio>
#include <cstdlib>

namespace lockstep {

void FuzzCheckFailed(const char* condition, const std::string& detail) {
  std::fprintf(stderr, "fuzz oracle failed: %s: %s\n", condition, detail.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace lockstep
