// base/fuzz_target.h
//
// A lockstep fuzz target is one source file that defines libFuzzer's entry point
//   extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
// holding the oracle (LOCKSTEP_FUZZ_CHECK aborts with a message when a property fails), and
// FuzzSeeds(): valid inputs of its format, so that mutation starts from where the deep checks
// are. base/fuzz.bzl builds the file two ways:
//   - `<name>`: under --config=fuzz, clang with libFuzzer, ASan and UBSan (tools/fuzz.sh runs it
//     for a set time); the seeds are written into the corpus directory named by
//     $LOCKSTEP_FUZZ_SEED_DIR before the search starts;
//   - `<name>_replay_test`: with the default compiler, a test that runs every seed, every seed
//     with each byte flipped (masks 0x01, 0x80, 0xff; 16 evenly spaced
//     positions of a seed over 4 KiB) and cuts of every seed
//     (base/fuzz_replay_main), so that CI exercises the oracle on every change without clang. Given
//     files or directories it replays those instead (a crash found by the fuzzer, or a corpus under
//     valgrind), and --write_seeds=DIR writes the seeds.
//
// Thread-safety: a target runs inputs one at a time.

#ifndef LOCKSTEP_BASE_FUZZ_TARGET_H_
#define LOCKSTEP_BASE_FUZZ_TARGET_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace lockstep {

// The target's seed inputs (defined by each fuzz target).
std::vector<std::string> FuzzSeeds();

// Prints "fuzz oracle failed: <condition>: <detail>" to stderr and aborts.
[[noreturn]] void FuzzCheckFailed(const char* condition, const std::string& detail);

}  // namespace lockstep

// Aborts the run (a finding) unless `condition` holds; `detail` says what was seen.
#define LOCKSTEP_FUZZ_CHECK(condition, detail)                           \
  do {                                                                   \
    if (!(condition)) ::lockstep::FuzzCheckFailed(#condition, (detail)); \
  } while (false)

#endif  // LOCKSTEP_BASE_FUZZ_TARGET_H_
