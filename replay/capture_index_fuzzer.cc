// Fuzz target (base/fuzz_target.h) for a state capture's index.json on arbitrary bytes.
//
// One real capture is written once; each input replaces its index.json and is sealed in
// complete.json (its SHA-256), as a hostile user can, so the input reaches the index's checks.
// Oracle: LoadStateCapture refuses the capture with an error naming it or loads it (never a
// crash or an abort on a mistyped or missing field); a loaded capture sits where its index says
// (Note [A capture against its place]) and compares equal to itself.

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/file_io.h"
#include "base/fuzz_target.h"
#include "base/json.h"
#include "base/sha256.h"
#include "replay/state_capture.h"
#include "replay/state_replay.h"

namespace lockstep {

namespace {

constexpr int64_t kStep = 2;
constexpr int kRank = 1;
constexpr int kWorld = 2;

// The capture's root, written once per process.
const std::string& Root() {
  static const std::string* root = [] {
    const char* dir = std::getenv("TEST_TMPDIR");
    auto* path = new std::string(
        absl::StrCat(dir != nullptr ? dir : "/tmp", "/capture_index_fuzz.", getpid()));
    replay::CaptureComponents c;
    c.weights = {{"w", at::arange(6, at::kFloat).reshape({2, 3})}};
    c.data_position = 5;
    for (const char* absent : {"ledger", "rng", "optimizer"}) c.absent[absent] = "fuzzing";
    const absl::Status written = replay::WriteStateCapture(*path, kStep, kRank, kWorld, c);
    LOCKSTEP_FUZZ_CHECK(written.ok(), written.ToString());
    return path;
  }();
  return *root;
}

std::string Dir() { return replay::CaptureDirectory(Root(), kStep, kRank); }

std::string Read(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path, size_t{1} << 26);
  LOCKSTEP_FUZZ_CHECK(text.ok(), text.status().ToString());
  return *text;
}

}  // namespace

std::vector<std::string> FuzzSeeds() {
  const std::string index = Read(Dir() + "/index.json");
  std::vector<std::string> seeds = {index};
  // The same index with fields of each kind at their edges, so mutation starts near them.
  absl::StatusOr<nlohmann::json> parsed = ParseJson(index, "index.json");
  LOCKSTEP_FUZZ_CHECK(parsed.ok(), parsed.status().ToString());
  nlohmann::json wide = *parsed;
  wide["step"] = int64_t{1} << 62;
  wide["components"]["rng"]["present"] = 1;
  seeds.push_back(DumpJson(wide));
  nlohmann::json bare = {{"format", replay::kStateCaptureFormat}};
  seeds.push_back(DumpJson(bare));
  return seeds;
}

}  // namespace lockstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lockstep;  // NOLINT: one entry point
  const std::string dir = Dir();
  const std::string index(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<nlohmann::json> complete = ParseJson(Read(dir + "/complete.json"), "complete");
  LOCKSTEP_FUZZ_CHECK(complete.ok(), complete.status().ToString());
  Sha256Hasher hasher;
  hasher.Append(index);
  (*complete)["index_sha256"] = DigestHex(hasher.Finish());
  WriteOptions fast;
  fast.durable = false;
  absl::Status written = WriteFileAtomically(dir + "/index.json", index, fast);
  if (written.ok())
    written = WriteFileAtomically(dir + "/complete.json", DumpJson(*complete), fast);
  LOCKSTEP_FUZZ_CHECK(written.ok(), written.ToString());
  const replay::CapturePlace place{kStep, kRank, kWorld};
  absl::StatusOr<replay::LoadedCapture> loaded = replay::LoadStateCapture(dir, place);
  if (!loaded.ok()) {
    LOCKSTEP_FUZZ_CHECK(absl::StrContains(loaded.status().message(), "index.json"),
                        loaded.status().ToString());
    return 0;
  }
  LOCKSTEP_FUZZ_CHECK(loaded->place.step == kStep && loaded->place.rank == kRank,
                      "a loaded capture is not at its place");
  LOCKSTEP_FUZZ_CHECK(loaded->context.is_object(), "the context is not an object");
  absl::StatusOr<std::optional<replay::CaptureDifference>> same =
      replay::CompareCaptures(*loaded, *loaded);
  LOCKSTEP_FUZZ_CHECK(same.ok() && !same->has_value(), "a capture differs from itself");
  return 0;
}
