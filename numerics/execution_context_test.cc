// numerics/execution_context: the record holds the documented fields, its digest covers exactly
// the stable part, it travels in safetensors metadata, and differences are named by path.

#include "numerics/execution_context.h"

#include <cstdlib>
#include <string>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "invariant/mode.h"
#include "numerics/deterministic_mode.h"
#include "numerics/safetensors.h"

namespace lockstep {
namespace numerics {
namespace {

using ::testing::ElementsAre;

TEST(ExecutionContextTest, RecordsTheDocumentedFieldsWithAStableDigest) {
  const nlohmann::json context =
      CaptureExecutionContext({{"seed", "1234"}, {"topology", "DP2xCP2"}});
  const nlohmann::json& stable = context["stable"];
  EXPECT_FALSE(stable["libtorch_version"].get<std::string>().empty());
  EXPECT_FALSE(stable["compiler"].get<std::string>().empty());
  // Stamped from git when built in a checkout (tools/workspace_status.sh).
  EXPECT_TRUE(stable["lockstep_commit"].is_string());
  EXPECT_TRUE(stable["cuda"].contains("built_with_cuda"));
  for (const char* key : {"deterministic_algorithms", "tf32_cublas", "tf32_cudnn",
                          "float32_matmul_precision", "cublas_workspace_config"}) {
    EXPECT_TRUE(stable["determinism"].contains(key)) << key;
  }
  EXPECT_EQ(stable["threads"]["intra_op"], at::get_num_threads());
  EXPECT_EQ(stable["caller"]["seed"], "1234");
  EXPECT_TRUE(context["volatile"].contains("host"));
  EXPECT_EQ(context["digest"], ContextDigest(context));
  // Volatile fields do not enter the digest; stable ones do.
  nlohmann::json later = context;
  later["volatile"]["pid"] = 1;
  EXPECT_EQ(ContextDigest(later), context["digest"]);
  later["stable"]["caller"]["seed"] = "1235";
  EXPECT_NE(ContextDigest(later), context["digest"]);
}

TEST(ExecutionContextTest, DifferencesAreNamedAndTravelInSafetensorsMetadata) {
  const nlohmann::json a = CaptureExecutionContext({{"seed", "1"}});
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  at::globalContext().setDeterministicAlgorithms(!deterministic, false);
  const nlohmann::json b = CaptureExecutionContext({{"seed", "2"}, {"extra", "x"}});
  at::globalContext().setDeterministicAlgorithms(deterministic, false);
  EXPECT_THAT(ContextDifferences(a, b),
              ElementsAre("caller.extra", "caller.seed", "determinism.deterministic_algorithms"));
  EXPECT_TRUE(ContextDifferences(a, a).empty());

  const std::string path = testing::TempDir() + "/with_context.safetensors";
  LOCKSTEP_ASSERT_OK(WriteSafetensors(path, {{"x", at::ones({2})}}, ContextMetadata(a)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(SafetensorsFile file, SafetensorsFile::Open(path));
  const std::optional<nlohmann::json> read = ContextFromMetadata(file.metadata());
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(*read, a);
  EXPECT_FALSE(ContextFromMetadata({{kContextMetadataKey, "not json"}}).has_value());
  EXPECT_FALSE(ContextFromMetadata({}).has_value());
}

// Environment values and caller fields are bytes (a path, a variable set by a launcher): ones that
// are not UTF-8 are recorded escaped, and the record is still written, digested and read back.
TEST(ExecutionContextTest, ValuesThatAreNotUtf8AreRecordedEscapedNeverThrown) {
  const char* const saved = std::getenv("OMP_NUM_THREADS");
  const std::string saved_value = saved == nullptr ? "" : saved;
  ASSERT_EQ(setenv("OMP_NUM_THREADS", "4\xff\xfe", 1), 0);
  const nlohmann::json context = CaptureExecutionContext({{"data", "/data/\xc3("}});
  if (saved == nullptr) {
    unsetenv("OMP_NUM_THREADS");
  } else {
    setenv("OMP_NUM_THREADS", saved_value.c_str(), 1);
  }
  EXPECT_EQ(ContextDigest(context), context["digest"]);

  const std::string path = testing::TempDir() + "/not_utf8.safetensors";
  LOCKSTEP_ASSERT_OK(WriteSafetensors(path, {{"x", at::ones({2})}}, ContextMetadata(context)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(SafetensorsFile file, SafetensorsFile::Open(path));
  const std::optional<nlohmann::json> read = ContextFromMetadata(file.metadata());
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ((*read)["stable"]["threads"]["omp_num_threads"], "4\\xff\\xfe");
  EXPECT_EQ((*read)["stable"]["caller"]["data"], "/data/\\xc3(");
}

// Two runs whose contexts agree ran the same kernels: placement-invariant mode is in the stable
// part, so it changes the digest.
TEST(ExecutionContextTest, RecordsPlacementInvariantMode) {
  const nlohmann::json off = CaptureExecutionContext();
  EXPECT_EQ(off["stable"]["determinism"]["placement_invariant"], false);
  nlohmann::json on;
  {
    invariant::PlacementInvariantScope mode;
    on = CaptureExecutionContext();
  }
  EXPECT_EQ(on["stable"]["determinism"]["placement_invariant"], true);
  EXPECT_NE(ContextDigest(on), ContextDigest(off));
  EXPECT_EQ(ContextDigest(CaptureExecutionContext()), ContextDigest(off));
}

// Last in this file: the mode, once enforced, stays enforced for the process.
TEST(ExecutionContextTest, SaysWhetherDeterministicModeWasEnforcedAndHolds) {
  const nlohmann::json before = CaptureExecutionContext()["stable"]["determinism"];
  EXPECT_EQ(before["mode_enforced"], false);
  const bool algorithms = at::globalContext().deterministicAlgorithms();
  LOCKSTEP_ASSERT_OK(EnforceDeterministicMode().status());
  const nlohmann::json enforced = CaptureExecutionContext()["stable"]["determinism"];
  EXPECT_EQ(enforced["mode_enforced"], true);
  EXPECT_EQ(enforced["mode_holds"], true);
  EXPECT_EQ(enforced["nccl_algo"], "Ring");
  EXPECT_EQ(enforced["nccl_proto"], "Simple");
  // Note [cuBLAS workspace setting]: set only for a LibTorch that demands it.
  EXPECT_EQ(enforced["cublas_workspace_config"], CublasWorkspaceConfigRequired() ? ":4096:8" : "");
  // Undone afterwards: the record says it no longer holds.
  at::globalContext().setDeterministicAlgorithms(false, false);
  EXPECT_EQ(CaptureExecutionContext()["stable"]["determinism"]["mode_holds"], false);
  at::globalContext().setDeterministicAlgorithms(algorithms, false);
}

}  // namespace
}  // namespace numerics
}  // namespace lockstep
