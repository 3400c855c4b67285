// Deterministic mode on a GPU: where the LibTorch built against demands CUBLAS_WORKSPACE_CONFIG,
// leaving it unset until CUDA work has started is refused; where it does not, the mode leaves it
// unset and cuBLAS runs under deterministic algorithms (Note [cuBLAS workspace setting]). Under
// the mode a CUDA operator without a deterministic implementation (histc) is a status naming it,
// while without the mode it runs. One test, in order: the mode is process-wide.

#include <cstdlib>

#include "ATen/ATen.h"
#include "base/status_testutil.h"
#include "base/torch_boundary.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "numerics/deterministic_mode.h"

namespace lockstep {
namespace numerics {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

absl::Status HistcOnTheGpu() {
  return CallTorch("histc under test", [] {
    const at::Tensor x = at::rand({1 << 16}, at::device(at::kCUDA));
    (void)at::histc(x, /*bins=*/64).sum().item<float>();
  });
}

TEST(DeterministicModeCudaTest, TooLateIsRefusedAndANondeterministicCudaOperatorIsAStatus) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  unsetenv("CUBLAS_WORKSPACE_CONFIG");
  // Without the mode the operator runs (and starts CUDA work).
  LOCKSTEP_EXPECT_OK(HistcOnTheGpu());
  if (CublasWorkspaceConfigRequired()) {
    // cuBLAS may already have read its workspace setting: unset now is refused, naming it.
    const absl::Status late = EnforceDeterministicMode().status();
    EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
    EXPECT_THAT(late.message(), AllOf(HasSubstr("CUBLAS_WORKSPACE_CONFIG is unset"),
                                      HasSubstr("CUDA work has already started")));
    EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
    // Set in the environment (as a launcher would), the mode is enforced.
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 1);
  }
  LOCKSTEP_ASSERT_OK(EnforceDeterministicMode().status());
  if (!CublasWorkspaceConfigRequired()) {
    EXPECT_EQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), nullptr) << "set though not demanded";
  }
  const absl::Status refused = HistcOnTheGpu();
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(refused.message(), AllOf(HasSubstr("histc under test"), HasSubstr("histc"),
                                       HasSubstr("does not have a deterministic implementation")));
  // The process continues: a deterministic operator still runs (a cuBLAS product, whatever the
  // variable), it gives the same bits twice, and the mode still holds.
  LOCKSTEP_EXPECT_OK(CallTorch("matmul", [] {
    const at::Tensor a = at::rand({512, 512}, at::device(at::kCUDA));
    EXPECT_TRUE(at::equal(at::matmul(a, a), at::matmul(a, a)));
  }));
  LOCKSTEP_EXPECT_OK(VerifyDeterministicMode());
}

}  // namespace
}  // namespace numerics
}  // namespace lockstep
