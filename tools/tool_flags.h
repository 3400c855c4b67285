// tools/tool_flags.h
//
// What every lockstep command-line tool does with its command line: Abseil flags (snake_case
// names, also accepted with hyphens: --rel-l2 is --rel_l2; --help from absl's usage library, the
// tool's usage text followed by the logging help of base/logging.h), glog initialised for the tool,
// and the positional arguments handed back. Values absl cannot parse are reported by absl ("Illegal
// value 'abc' specified for flag 'dp'", "Unknown command line flag 'x'") and the tool exits 2, the
// tools' "bad input" code.
//
// Thread-safety: call once, at the start of main.
//
// Example:
//   ABSL_FLAG(int, nproc, 1, "number of processes");
//   int main(int argc, char** argv) {
//     std::vector<std::string> args = tools::ParseToolFlags(argc, argv, "launch [FLAGS] -- PROG");
//     ...
//   }

#ifndef LOCKSTEP_TOOLS_TOOL_FLAGS_H_
#define LOCKSTEP_TOOLS_TOOL_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace lockstep {
namespace tools {

// The exit code of a tool given bad input (flags, arguments, files).
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

}  // namespace tools
}  // namespace lockstep

#endif  // LOCKSTEP_TOOLS_TOOL_FLAGS_H_
