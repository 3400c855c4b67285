// The diverge tool end to end: recordings written by numerics::Recorder, exit codes, the named
// module, the JSON, and bad input.

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
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
  numerics::Recorder recorder(numerics::RecorderOptions().set_keep_full_tensors(3));
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

std::pair<int, std::string> Diverge(const std::string& args) {
  FILE* pipe = popen(absl::StrCat("tools/diverge ", args, " 2>&1").c_str(), "r");
  std::string out;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
  const int status = pclose(pipe);
  return {WEXITSTATUS(status), out};
}

TEST(DivergeToolTest, NamesTheFirstDivergentModuleAndExitsByVerdict) {
  const std::string a = Record("a", -1), same = Record("same", -1), bumped = Record("b", 1);
  auto [rc, out] = Diverge(absl::StrCat(a, " ", same));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr("no divergence: 9 records"));
  const std::string json_path = testing::TempDir() + "/divergence.json";
  std::tie(rc, out) = Diverge(absl::StrCat(a, " ", bumped, " --out=", json_path));
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
  auto [rc, out] = Diverge("/nonexistent.rec /nonexistent.rec");
  EXPECT_EQ(rc, 2);
  EXPECT_THAT(out, HasSubstr("diverge: cannot open '/nonexistent.rec'"));
  std::tie(rc, out) = Diverge("only-one.rec");
  EXPECT_EQ(rc, 2);
  EXPECT_THAT(out, HasSubstr("expected two recordings, got 1"));
}

}  // namespace
}  // namespace lockstep
