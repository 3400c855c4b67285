#include "numerics/deterministic_mode.h"

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status_testutil.h"
#include "base/torch_boundary.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace numerics {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr const char* kVariables[] = {"CUBLAS_WORKSPACE_CONFIG", "NCCL_ALGO", "NCCL_PROTO"};

// Each test starts from an environment without the mode's variables and LibTorch's defaults,
// and puts back what the process had.
class DeterministicModeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVariables) {
      const char* value = std::getenv(v);
      if (value != nullptr) saved_env_[v] = value;
      unsetenv(v);
    }
    at::Context& context = at::globalContext();
    saved_algorithms_ = context.deterministicAlgorithms();
    saved_warn_only_ = context.deterministicAlgorithmsWarnOnly();
    saved_cudnn_deterministic_ = context.deterministicCuDNN();
    saved_benchmark_ = context.benchmarkCuDNN();
    context.setDeterministicAlgorithms(false, false);
    context.setDeterministicCuDNN(false);
    context.setBenchmarkCuDNN(false);
  }
  void TearDown() override {
    for (const char* v : kVariables) {
      unsetenv(v);
      if (saved_env_.count(v) > 0) setenv(v, saved_env_[v].c_str(), 1);
    }
    at::Context& context = at::globalContext();
    context.setDeterministicAlgorithms(saved_algorithms_, saved_warn_only_);
    context.setDeterministicCuDNN(saved_cudnn_deterministic_);
    context.setBenchmarkCuDNN(saved_benchmark_);
  }

  static std::optional<std::string> Env(const char* name) {
    const char* value = std::getenv(name);
    return value == nullptr ? std::nullopt : std::optional<std::string>(value);
  }

  // Nothing the mode sets was set.
  static void ExpectUnchanged() {
    for (const char* v : kVariables) EXPECT_EQ(Env(v), std::nullopt) << v;
    EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
    EXPECT_FALSE(at::globalContext().deterministicCuDNN());
  }

 private:
  std::map<std::string, std::string> saved_env_;
  bool saved_algorithms_ = false, saved_warn_only_ = false;
  bool saved_cudnn_deterministic_ = false, saved_benchmark_ = false;
};

TEST_F(DeterministicModeTest, SetsEverySettingAndVerifiesThem) {
  EXPECT_THAT(VerifyDeterministicMode().code(), absl::StatusCode::kFailedPrecondition);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const DeterministicSettings found, EnforceDeterministicMode());
  // Set only for a LibTorch that demands it (Note [cuBLAS workspace setting]).
  const bool cublas_required = CublasWorkspaceConfigRequired();
  EXPECT_EQ(found.cublas_workspace_config_required, cublas_required);
  EXPECT_EQ(Env("CUBLAS_WORKSPACE_CONFIG"),
            cublas_required ? std::optional<std::string>(":4096:8") : std::nullopt);
  EXPECT_EQ(found.cublas_workspace_config, cublas_required ? ":4096:8" : "");
  EXPECT_EQ(Env("NCCL_ALGO"), "Ring");
  EXPECT_EQ(Env("NCCL_PROTO"), "Simple");
  const at::Context& context = at::globalContext();
  EXPECT_TRUE(context.deterministicAlgorithms());
  EXPECT_FALSE(context.deterministicAlgorithmsWarnOnly());
  EXPECT_TRUE(context.deterministicCuDNN());
  EXPECT_FALSE(context.benchmarkCuDNN());
  LOCKSTEP_EXPECT_OK(VerifyDeterministicMode());
  EXPECT_TRUE(DeterministicModeEnforced());
  LOCKSTEP_EXPECT_OK(EnforceDeterministicMode().status());  // idempotent
}

TEST_F(DeterministicModeTest, AValueTheModeAcceptsIsKept) {
  setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8", 1);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const DeterministicSettings found, EnforceDeterministicMode());
  EXPECT_EQ(Env("CUBLAS_WORKSPACE_CONFIG"), ":16:8");
  EXPECT_EQ(found.cublas_workspace_config, ":16:8");
}

struct Contradicting {
  const char* variable;
  const char* value;
  const char* required;
};

class ContradictingVariable : public DeterministicModeTest,
                              public ::testing::WithParamInterface<Contradicting> {};

TEST_P(ContradictingVariable, IsRefusedNamingItsValueAndNothingChanges) {
  const Contradicting c = GetParam();
  setenv(c.variable, c.value, 1);
  const absl::Status status = EnforceDeterministicMode().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr(absl::StrCat(c.variable, " is '", c.value, "'")),
                                      HasSubstr(absl::StrCat("requires '", c.required, "'"))));
  EXPECT_EQ(Env(c.variable), c.value);  // not overridden
  unsetenv(c.variable);
  ExpectUnchanged();
}

INSTANTIATE_TEST_SUITE_P(EachVariable, ContradictingVariable,
                         ::testing::Values(Contradicting{"CUBLAS_WORKSPACE_CONFIG", ":0:0",
                                                         ":4096:8"},
                                           Contradicting{"NCCL_ALGO", "Tree", "Ring"},
                                           Contradicting{"NCCL_PROTO", "LL128", "Simple"}),
                         [](const ::testing::TestParamInfo<Contradicting>& info) {
                           return std::string(info.param.variable);
                         });

TEST_F(DeterministicModeTest, WarnOnlyDeterministicAlgorithmsAreRefused) {
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  const absl::Status status = EnforceDeterministicMode().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(), HasSubstr("warn-only mode is on"));
  EXPECT_TRUE(at::globalContext().deterministicAlgorithmsWarnOnly());  // not overridden
}

TEST_F(DeterministicModeTest, CudnnBenchmarkIsRefused) {
  at::globalContext().setBenchmarkCuDNN(true);
  const absl::Status status = EnforceDeterministicMode().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(), HasSubstr("cuDNN benchmark mode is on"));
  EXPECT_TRUE(at::globalContext().benchmarkCuDNN());
  ExpectUnchanged();
}

TEST_F(DeterministicModeTest, VerifyNamesASettingUndoneAfterwards) {
  LOCKSTEP_ASSERT_OK(EnforceDeterministicMode().status());
  at::globalContext().setDeterministicAlgorithms(false, false);
  const absl::Status status = VerifyDeterministicMode();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("deterministic algorithms is off"));
  unsetenv("NCCL_PROTO");
  at::globalContext().setDeterministicAlgorithms(true, false);
  EXPECT_THAT(VerifyDeterministicMode().message(), HasSubstr("NCCL_PROTO is unset"));
}

// put_ without accumulation has no deterministic CPU implementation: under the mode it is a
// status naming it (LibTorch's refusal through the exception boundary), without it it runs.
absl::Status PutWithoutAccumulation() {
  return CallTorch("put_ under test", [] {
    at::Tensor x = at::zeros({10});
    x.put_(at::tensor({1, 1}, at::kLong), at::tensor({1.0f, 2.0f}), /*accumulate=*/false);
  });
}

TEST_F(DeterministicModeTest, ANondeterministicOperatorIsAStatusNamingIt) {
  LOCKSTEP_EXPECT_OK(PutWithoutAccumulation());
  LOCKSTEP_ASSERT_OK(EnforceDeterministicMode().status());
  const absl::Status status = PutWithoutAccumulation();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), AllOf(HasSubstr("put_ under test"), HasSubstr("put_"),
                                      HasSubstr("does not have a deterministic implementation")));
}

}  // namespace
}  // namespace numerics
}  // namespace lockstep
