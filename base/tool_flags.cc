#include "base/tool_flags.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/logging.h"

namespace lockstep {
namespace {

// absl::ParseCommandLine exits the process (status 1) on a flag it cannot parse. While it runs,
// this handler turns that exit into the tools' bad-input status. Asking for usage (--help,
// --version, ...) exits through absl too, after it printed what was asked: that is a success,
// status 0, as a Python user's tools (argparse, torchrun) exit.
enum class Parsing { kNo, kFlags, kUsage };
std::atomic<Parsing> parsing{Parsing::kNo};

void ExitAsBadInput() {
  const Parsing now = parsing.load();
  if (now == Parsing::kNo) return;
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(now == Parsing::kUsage ? 0 : kBadInputExitCode);
}

// Whether the command line (before a "--") names `flag` exactly, with one or two dashes, with or
// without a value. A flag that merely starts like it (--helpfoo) is not it.
bool HasFlag(int argc, char** argv, absl::string_view flag) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) continue;
    if (arg.substr(0, arg.find('=')) == flag) return true;
  }
  return false;
}

// Whether the command line asks for usage (--help, --helpfull, --version, --helpon=X, ...); a
// flag that merely starts like one (--helpfoo) is an unknown flag, bad input like any other.
bool AsksForUsage(int argc, char** argv) {
  for (const char* usage :
       {"help", "helpfull", "helpshort", "helppackage", "version", "helpon", "helpmatch"}) {
    if (HasFlag(argc, argv, usage)) return true;
  }
  return false;
}

// One spelling: a flag name with hyphens whose snake_case form is a known flag (--inject-oom for
// --inject_oom) is refused here, with the right spelling, before absl would report it only as an
// unknown flag. Nothing is rewritten; absl parses the command line.
void RefuseHyphenatedFlagNames(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::StartsWith(arg, "--")) continue;
    const absl::string_view name = arg.substr(2, arg.find('=') - 2);
    if (name.find('-') == absl::string_view::npos) continue;
    std::string snake(name);
    std::replace(snake.begin(), snake.end(), '-', '_');
    if (absl::FindCommandLineFlag(snake) == nullptr) continue;
    std::fprintf(stderr, "ERROR: flag names are snake_case: use --%s, not --%s\n", snake.c_str(),
                 std::string(name).c_str());
    std::exit(kBadInputExitCode);
  }
}

}  // namespace

std::vector<std::string> ParseToolFlags(int argc, char** argv, absl::string_view usage) {
  RefuseHyphenatedFlagNames(argc, argv);
  absl::SetProgramUsageMessage(absl::StrCat(usage, "\n\n", kLoggingHelp));
  InitLogging(argc > 0 ? argv[0] : "lockstep");
  static const bool registered = [] { return std::atexit(&ExitAsBadInput) == 0; }();
  (void)registered;
  // --only_check_args exits with absl's own status (0: the flags parse).
  parsing = AsksForUsage(argc, argv)                 ? Parsing::kUsage
            : HasFlag(argc, argv, "only_check_args") ? Parsing::kNo
                                                     : Parsing::kFlags;
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  parsing = Parsing::kNo;
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

}  // namespace lockstep
