// The diverge tool end to end: recordings written by numerics::Recorder, exit codes, the named
// module, the JSON, and bad input.

#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/status_testutil.h"
#include "base/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "numerics/divergence.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;

// Three tapped blocks; `bump` perturbs block `bump`'s output.
std::string Record(const std::string& name, int bump) {
  at::manual_seed(0);
  at::Tensor x = at::randn({2, 4}).requires_grad_();
  numerics::RecorderOptions options;
  options.keep_full_tensors = 3;
  numerics::Recorder recorder(options);
  for (int i = 0; i < 3; ++i) {
    const std::string block = absl::StrCat("block", i);
    at::Tensor w = at::randn({4, 4});
    x = recorder.Enter(block, x);
    at::Tensor y = at::linear(x, w).tanh();
    if (i == bump) y = y * 1.5;
    x = recorder.Exit(block, y);
  }
  x.sum().backward();
  const std::string path = absl::StrCat(testing::TempDir(), "/", name, ".rec");
  EXPECT_TRUE(recorder.Save(path).ok());
  return path;
}

// Runs tools/diverge with `args`: its exit code and its output (stdout and stderr together).
absl::StatusOr<std::pair<int, std::string>> Diverge(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"tools/diverge"};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<Child> child = Child::Exec(ChildOptions::Output(), argv, {});
  if (!child.ok()) return child.status();
  Child* pointer = &*child;
  std::string out;
  for (;;) {
    absl::StatusOr<int> open = PollChannels(
        {pointer}, absl::Minutes(1),
        [&](size_t, absl::string_view bytes) { out.append(bytes.data(), bytes.size()); });
    if (!open.ok()) return open.status();
    if (*open == 0) break;
  }
  child->Reap();
  return std::make_pair(child->ExitCode(), out);
}

TEST(DivergeToolTest, NamesTheFirstDivergentModuleAndExitsByVerdict) {
  const std::string a = Record("a", -1), same = Record("same", -1), bumped = Record("b", 1);
  int rc = 0;
  std::string out;
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::tie(rc, out), Diverge({a, same}));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr("no divergence: 9 records"));
  const std::string json_path = testing::TempDir() + "/divergence.json";
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::tie(rc, out), Diverge({a, bumped, "--out=" + json_path}));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_THAT(out,
              HasSubstr("first divergence at record 1: module block1, forward_output (digest)"));
  EXPECT_THAT(out, HasSubstr("1/block1/forward_output: FAIL"));  // the kept tensors' comparison
  std::ifstream in(json_path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["divergence"]["module"], "block1");
  EXPECT_EQ(j["divergence"]["comparison"]["passed"], false);
  EXPECT_TRUE(j["context"].contains("digest"));
}

TEST(DivergeToolTest, BadInputIsOneLineAndExitCode2) {
  int rc = 0;
  std::string out;
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::tie(rc, out),
                                Diverge({"/nonexistent.rec", "/nonexistent.rec"}));
  EXPECT_EQ(rc, 2);
  EXPECT_THAT(out, HasSubstr("diverge: cannot open '/nonexistent.rec'"));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::tie(rc, out), Diverge({"only-one.rec"}));
  EXPECT_EQ(rc, 2);
  EXPECT_THAT(out, HasSubstr("expected two recordings, got 1"));
}

}  // namespace
}  // namespace lockstep
