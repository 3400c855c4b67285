// base/tool_flags.h
//
// What every lockstep command-line program (tools, benchmarks with their own main, test drivers)
// does with its command line: Abseil flags, spelled snake_case only (--inject_oom; a hyphenated
// spelling of a known flag, --inject-oom, is refused with the right spelling named); --help from
// absl's usage library, the program's usage text followed by the logging help of base/logging.h;
// glog initialised for the program; the positional arguments handed back. Values absl cannot
// parse are reported by absl ("Illegal value 'abc' specified for flag 'dp'", "Unknown command line
// flag 'x'") and the program exits 2, the tools' "bad input" code; --help keeps absl's status.
//
// Thread-safety: call once, at the start of main.
//
// Example:
//   ABSL_FLAG(int, nproc, 1, "number of processes");
//   int main(int argc, char** argv) {
//     std::vector<std::string> args = lockstep::ParseToolFlags(argc, argv, "launch [FLAGS] -- P");
//     ...
//   }

#ifndef LOCKSTEP_BASE_TOOL_FLAGS_H_
#define LOCKSTEP_BASE_TOOL_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace lockstep {

// The exit code of a program given bad input (flags, arguments, files).
inline constexpr int kBadInputExitCode = 2;

// Parses the process's flags (see above) and returns the positional arguments after the program
// name, those after a "--" included.
std::vector<std::string> ParseToolFlags(int argc, char** argv, absl::string_view usage);

// A flag value naming a file to write: absent by default, never empty when given
// ("--out=" is refused by the parser, naming the flag).
struct OutputPath {
  std::string path;  // empty: the flag was not given
};
// How --help shows an OutputPath flag that was not given.
inline constexpr absl::string_view kNoOutputPath = "(none)";
bool AbslParseFlag(absl::string_view text, OutputPath* out, std::string* error);
std::string AbslUnparseFlag(const OutputPath& out);

// kInvalidArgument "unexpected argument <first>" when `args` is not empty.
absl::Status NoPositionalArguments(const std::vector<std::string>& args);

}  // namespace lockstep

#endif  // LOCKSTEP_BASE_TOOL_FLAGS_H_
