// Under libFuzzer (base/fuzz_target.h): before the search starts, writes the target's seeds into
// $LOCKSTEP_FUZZ_SEED_DIR when it is set, so that the corpus directory given to the fuzzer
// starts from valid inputs.

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "base/fuzz_target.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  const char* dir = std::getenv("LOCKSTEP_FUZZ_SEED_DIR");
  if (dir == nullptr || *dir == '\0') return 0;
  const std::vector<std::string> seeds = lockstep::FuzzSeeds();
  for (size_t i = 0; i < seeds.size(); ++i) {
    const std::string path = std::string(dir) + "/seed-" + std::to_string(i);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << seeds[i];
    if (!out) {
      std::fprintf(stderr, "cannot write seed %s: %s\n", path.c_str(), std::strerror(errno));
      std::exit(1);
    }
  }
  return 0;
}
