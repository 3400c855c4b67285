// The main of a fuzz target built without libFuzzer (base/fuzz_target.h): replays the seeds and
// their single-byte mutations and cuts (no arguments, or --seeds with files), and the files
// and directories named on the command line, through LLVMFuzzerTestOneInput; --write_seeds=DIR
// writes the seeds as files.
//
//   <target> [--seeds] [FILE_OR_DIR ...] | <target> --write_seeds=DIR

#include <dirent.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "base/fuzz_target.h"
#include "base/tool_flags.h"

ABSL_FLAG(bool, seeds, false, "replay the seeds (and their mutations) before the files named");
ABSL_FLAG(std::string, write_seeds, "", "write the seeds as files into this directory and exit");

namespace {

void Run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

bool ReadFile(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream bytes;
  bytes << in.rdbuf();
  out = bytes.str();
  return true;
}

// A seed larger than this (one made to reach a size, count or nesting limit, where one run can
// take a large fraction of a second) has only kLargeSeedFlips positions flipped, evenly spaced:
// libFuzzer's search mutates it everywhere; the replay keeps CI's cost bounded.
constexpr size_t kLargeSeedBytes = 4096;
constexpr size_t kLargeSeedFlips = 16;

// Every seed, each byte of it (or kLargeSeedFlips of a large one) flipped under three masks, and
// cuts at 64 evenly spaced lengths.
int ReplaySeeds() {
  const std::vector<std::string> seeds = lockstep::FuzzSeeds();
  if (seeds.empty()) {
    std::fprintf(stderr, "the fuzz target has no seeds\n");
    return 1;
  }
  size_t runs = 0;
  for (const std::string& seed : seeds) {
    Run(seed);
    ++runs;
    const bool large = seed.size() > kLargeSeedBytes;
    const size_t positions = large ? kLargeSeedFlips : seed.size();
    for (size_t p = 0; p < positions; ++p) {
      const size_t i = large ? p * seed.size() / positions : p;
      for (const unsigned char mask : {0x01, 0x80, 0xff}) {
        std::string flipped = seed;
        flipped[i] = static_cast<char>(flipped[i] ^ mask);
        Run(flipped);
        ++runs;
      }
    }
    for (size_t cut = 0; cut < 64; ++cut) {
      Run(seed.substr(0, seed.size() * cut / 64));
      ++runs;
    }
  }
  std::printf("replayed %zu seeds and %zu mutations of them: every oracle held\n", seeds.size(),
              runs - seeds.size());
  return 0;
}

int WriteSeeds(const std::string& dir) {
  const std::vector<std::string> seeds = lockstep::FuzzSeeds();
  for (size_t i = 0; i < seeds.size(); ++i) {
    const std::string path = dir + "/seed-" + std::to_string(i);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << seeds[i];
    if (!out) {
      std::fprintf(stderr, "cannot write %s: %s\n", path.c_str(), std::strerror(errno));
      return 1;
    }
  }
  std::printf("wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> files = lockstep::ParseToolFlags(
      argc, argv, "fuzz target replay: <target> [--seeds] [FILE_OR_DIR ...] | --write_seeds=DIR");
  const std::string write_dir = absl::GetFlag(FLAGS_write_seeds);
  if (!write_dir.empty()) {
    if (!files.empty() || absl::GetFlag(FLAGS_seeds)) {
      std::fprintf(stderr, "--write_seeds=%s takes no files and no --seeds\n", write_dir.c_str());
      return lockstep::kBadInputExitCode;
    }
    return WriteSeeds(write_dir);
  }
  if (files.empty()) return ReplaySeeds();
  // --seeds first: the seeds and their mutations, then the files that follow.
  if (absl::GetFlag(FLAGS_seeds)) {
    if (const int status = ReplaySeeds(); status != 0) return status;
  }
  size_t runs = 0;
  for (const std::string& file : files) {
    std::vector<std::string> paths;
    struct stat info;
    if (stat(file.c_str(), &info) != 0) {
      std::fprintf(stderr, "%s: %s\n", file.c_str(), std::strerror(errno));
      return 1;
    }
    if (S_ISDIR(info.st_mode)) {
      // The directory's entries other than . and .. (a libFuzzer corpus is flat).
      DIR* dir = opendir(file.c_str());
      if (dir == nullptr) {
        std::fprintf(stderr, "%s: %s\n", file.c_str(), std::strerror(errno));
        return 1;
      }
      while (const dirent* entry = readdir(dir)) {
        const std::string name = entry->d_name;
        if (name != "." && name != "..") paths.push_back(file + "/" + name);
      }
      closedir(dir);
    } else {
      paths.push_back(file);
    }
    for (const std::string& path : paths) {
      std::string input;
      if (!ReadFile(path, input)) {
        std::fprintf(stderr, "cannot read %s\n", path.c_str());
        return 1;
      }
      Run(input);
      ++runs;
    }
  }
  std::printf("replayed %zu inputs: every oracle held\n", runs);
  return 0;
}
