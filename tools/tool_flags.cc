#include "tools/tool_flags.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"

namespace lockstep {
namespace tools {
namespace {

// absl::ParseCommandLine exits the process (status 1) on a flag it cannot parse. While it runs,
// this handler turns that exit into the tools' bad-input status. Asking for --help (or another
// usage flag) exits through absl too and keeps absl's status.
std::atomic<bool> parsing{false};

void ExitAsBadInput() {
  if (parsing.load()) _exit(kBadInputExitCode);
}

bool AsksForUsage(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    for (const char* usage : {"help", "helpfull", "helpshort", "helppackage", "version",
                              "only_check_args", "helpon", "helpmatch"}) {
      if (absl::StartsWith(arg, absl::StrCat("--", usage)) ||
          absl::StartsWith(arg, absl::StrCat("-", usage))) {
        return true;
      }
    }
  }
  return false;
}

}  // namespace

namespace {

// Flag names may be spelled with hyphens (--rel-l2, --inject-oom): they are rewritten to the
// snake_case names Abseil knows, up to a "--" that ends the flags. Values are left alone.
void AcceptHyphenatedFlagNames(int argc, char** argv) {
  static std::vector<std::string>* rewritten = new std::vector<std::string>();
  rewritten->reserve(argc);
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 3 || arg.substr(0, 2) != "--") continue;
    const size_t equals = arg.find('=');
    std::string name(
        arg.substr(2, equals == absl::string_view::npos ? absl::string_view::npos : equals - 2));
    if (name.find('-') == std::string::npos) continue;
    std::replace(name.begin(), name.end(), '-', '_');
    rewritten->push_back(
        absl::StrCat("--", name, equals == absl::string_view::npos ? "" : arg.substr(equals)));
    argv[i] = rewritten->back().data();
  }
}

}  // namespace

std::vector<std::string> ParseToolFlags(int argc, char** argv, absl::string_view usage) {
  AcceptHyphenatedFlagNames(argc, argv);
  absl::SetProgramUsageMessage(absl::StrCat(usage, "\n\n", kLoggingHelp));
  InitLogging(argc > 0 ? argv[0] : "lockstep");
  static const bool registered = [] { return std::atexit(&ExitAsBadInput) == 0; }();
  (void)registered;
  parsing = !AsksForUsage(argc, argv);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  parsing = false;
  return std::vector<std::string>(rest.begin() + (rest.empty() ? 0 : 1), rest.end());
}

bool AbslParseFlag(absl::string_view text, OutputPath* out, std::string* error) {
  if (text == kNoOutputPath) {  // the default's spelling: not given
    out->path.clear();
    return true;
  }
  if (text.empty()) {
    *error = "is empty; give a file name, or leave the flag out";
    return false;
  }
  out->path = std::string(text);
  return true;
}

std::string AbslUnparseFlag(const OutputPath& out) {
  return out.path.empty() ? std::string(kNoOutputPath) : out.path;
}

absl::Status NoPositionalArguments(const std::vector<std::string>& args) {
  if (args.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("unexpected argument ", args.front()));
}

}  // namespace tools
}  // namespace lockstep
