// The variability checks (variability.h) on multi-process Gloo worlds: repeatability, actors and
// packing invariance hold on DP1 x CP2 and DP2 x TP2; the negative control (one module made
// nondeterministic) makes them fail naming that module. Each rank's check goes back to the test as
// JSON in a file, since a rank is a process. Built twice: //qualification:variability_test on the
// CPU and, with LOCKSTEP_VARIABILITY_ON_CUDA, //qualification:variability_cuda_test (gpu) with
// every rank's tensors on CUDA device 0 (the processes share it), where the control's
// nondeterminism is floating-point atomics.

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/status_testutil.h"
#include "base/temp_dir.h"
#include "collectives/topology.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "invariant/mode.h"
#include "numerics/deterministic_mode.h"
#include "qualification/variability.h"
#include "testing/process_world.h"

namespace lockstep {
namespace qualification {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

#ifdef LOCKSTEP_VARIABILITY_ON_CUDA
const c10::Device kDevice(c10::kCUDA, 0);
#else
const c10::Device kDevice(c10::kCPU);
#endif

// What every rank does first, as qualify's workers do.
void PrepareRank() { numerics::PrepareCublasForDeterminism(); }

enum class Which { kRepeatability, kPacking };

absl::Status WriteCheck(const VariabilityCheck& check, const std::string& path) {
  std::ofstream(path) << json{
      {"name", check.name},
      {"passed", check.passed},
      {"detail", check.detail},
      {"evidence",
       check.evidence}}.dump();
  return absl::OkStatus();
}

json ReadCheck(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in, nullptr, false);
}

// Runs one check on a DP x TP x CP world (each rank under placement-invariant mode if asked);
// returns each rank's check.
std::vector<json> RunWorld(int dp, int tp, int cp, NegativeControl control, Which which,
                           const std::string& dir, bool placement_invariant = false) {
  collectives::ProcessWorldOptions options = collectives::ProcessWorldOptions::Of(dp * tp * cp);
  options.deadline = absl::Seconds(240);
  const std::vector<absl::Status> statuses = collectives::RunProcessWorld(
      options, [&](int rank, collectives::Communicator& world) -> absl::Status {
        PrepareRank();
        std::optional<invariant::PlacementInvariantScope> mode;
        if (placement_invariant) mode.emplace();
        LOCKSTEP_ASSIGN_OR_RETURN(collectives::Topology topology,
                                  collectives::Topology::CreateExact(world.size(), dp, tp, cp));
        LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<VariabilityRank> v,
                                  VariabilityRank::Create(world, topology, control, kDevice));
        absl::StatusOr<VariabilityCheck> check =
            which == Which::kRepeatability ? v->Repeatability() : v->PackingInvariance();
        LOCKSTEP_RETURN_IF_ERROR(check.status());
        return WriteCheck(*check, absl::StrCat(dir, "/check", rank, ".json"));
      });
  std::vector<json> checks;
  for (size_t r = 0; r < statuses.size(); ++r) {
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
    checks.push_back(ReadCheck(absl::StrCat(dir, "/check", r, ".json")));
  }
  return checks;
}

TEST(RepeatabilityTest, ColdAndWarmPassesAreBitIdenticalOnCp2AndTp2) {
  for (auto [dp, tp, cp] : {std::tuple{1, 1, 2}, std::tuple{2, 2, 1}}) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(TempDir dir, TempDir::Make("repeatability"));
    for (const json& check :
         RunWorld(dp, tp, cp, NegativeControl::kNone, Which::kRepeatability, dir.path())) {
      EXPECT_TRUE(check.value("passed", false)) << check.value("detail", "");
      EXPECT_THAT(check.value("detail", ""), HasSubstr("bit-identical"));
      // The recording covers every module forward and backward and every leaf.
      EXPECT_GT(check["evidence"]["records"].size(), 20u);
    }
  }
}

TEST(RepeatabilityTest, ANondeterministicModuleIsNamedAsTheFirstDivergence) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(TempDir dir, TempDir::Make("repeatability_control"));
  for (const json& check :
       RunWorld(1, 1, 2, NegativeControl::kNondeterministicOp, Which::kRepeatability, dir.path())) {
    EXPECT_FALSE(check.value("passed", true));
    EXPECT_THAT(check.value("detail", ""),
                HasSubstr(absl::StrCat("first divergence at ", kNondeterministicModule)));
    const json& first = check["evidence"]["first_divergence"];
    EXPECT_EQ(first.value("module", ""), kNondeterministicModule) << first.dump();
    EXPECT_EQ(first.value("kind", ""), "forward_output") << first.dump();
    // Parameters before the broken module receive other gradients through it: the difference
    // entered in their incoming contributions, not in the accumulation.
    bool incoming = false;
    for (const json& leaf : check["evidence"]["leaf_gradients"]) {
      incoming = incoming || leaf.value("verdict", "") == "incoming";
    }
    EXPECT_TRUE(incoming) << check["evidence"]["leaf_gradients"].dump();
  }
}

// Two actors, each a world of its own processes loading the state a third world saved.
std::vector<json> RunActors(NegativeControl control, const std::string& dir) {
  const int dp = 1, tp = 1, cp = 2;
  collectives::ProcessWorldOptions options = collectives::ProcessWorldOptions::Of(dp * tp * cp);
  options.deadline = absl::Seconds(240);
  auto world = [&](auto body) {
    for (const absl::Status& s : collectives::RunProcessWorld(
             options, [&](int rank, collectives::Communicator&w) -> absl::Status {
               PrepareRank();
               LOCKSTEP_ASSIGN_OR_RETURN(collectives::Topology topology,
                                         collectives::Topology::CreateExact(w.size(), dp, tp, cp));
               LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<VariabilityRank> v,
                                         VariabilityRank::Create(w, topology, control, kDevice));
               return body(rank, *v);
             })) {
      EXPECT_TRUE(s.ok()) << s;
    }
  };
  world([&](int, VariabilityRank& v) { return v.SaveActorState(dir + "/state"); });
  world([&](int, VariabilityRank& v) { return v.RunActor(dir + "/state", dir + "/a"); });
  world([&](int, VariabilityRank& v) { return v.RunActor(dir + "/state", dir + "/b"); });
  world([&](int rank, VariabilityRank&) -> absl::Status {
    LOCKSTEP_ASSIGN_OR_RETURN(VariabilityCheck check, CompareActors(dir + "/a", dir + "/b", rank));
    return WriteCheck(check, absl::StrCat(dir, "/actors", rank, ".json"));
  });
  std::vector<json> checks;
  for (int r = 0; r < dp * tp * cp; ++r) {
    checks.push_back(ReadCheck(absl::StrCat(dir, "/actors", r, ".json")));
  }
  return checks;
}

TEST(ActorsTest, TwoProcessesLoadingTheSameStateAgreeBitForBit) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(TempDir dir, TempDir::Make("actors"));
  for (const json& check : RunActors(NegativeControl::kNone, dir.path())) {
    EXPECT_TRUE(check.value("passed", false)) << check.value("detail", "");
    const json& evidence = check["evidence"];
    EXPECT_EQ(evidence["inventory_a"]["state_digest"], evidence["inventory_b"]["state_digest"]);
    // Weights and Adam's exp_avg, exp_avg_sq and step of each of the 14 tensors.
    EXPECT_EQ(evidence["inventory_a"].value("tensors", 0), 14 * 4) << evidence["inventory_a"];
    EXPECT_TRUE(evidence["context_differences"].empty());
    EXPECT_EQ(evidence["context_a"]["digest"], evidence["context_b"]["digest"]);
  }
}

TEST(ActorsTest, ANondeterministicModuleMakesTheActorsDifferThere) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(TempDir dir, TempDir::Make("actors_control"));
  for (const json& check : RunActors(NegativeControl::kNondeterministicOp, dir.path())) {
    EXPECT_FALSE(check.value("passed", true));
    EXPECT_THAT(check.value("detail", ""),
                HasSubstr(absl::StrCat("first divergence at ", kNondeterministicModule)));
    // What they loaded was the same: the difference is the computation's.
    EXPECT_EQ(check["evidence"]["inventory_a"]["state_digest"],
              check["evidence"]["inventory_b"]["state_digest"]);
  }
}

// Both actors' loads leave Adam's state behind: they agree with each other, and only the
// inventory written when the state was saved shows what they lost.
TEST(ActorsTest, ALoadThatRestoresLessThanWasSavedFails) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(TempDir dir, TempDir::Make("actors_partial"));
  for (const json& check : RunActors(NegativeControl::kActorPartialLoad, dir.path())) {
    EXPECT_FALSE(check.value("passed", true));
    EXPECT_THAT(check.value("detail", ""),
                HasSubstr("actor a's load restored less than was saved"));
    EXPECT_EQ(check["evidence"]["inventory_a"]["state_digest"],
              check["evidence"]["inventory_b"]["state_digest"]);
  }
}

// Two actors' memory caps (48 and 24 tokens) pack the batch differently; admission's recovery
// splits a third way. Each placement reproduces its own bits, and a sequence's outputs either
// match across placements or the first module that depends on the placement is named.
TEST(PackingInvarianceTest, PlacementsOfTwoMemoryCapsAreComparedSequenceBySequence) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(TempDir dir, TempDir::Make("packing"));
  for (const json& check : RunWorld(1, 1, 2, NegativeControl::kNone, Which::kPacking, dir.path())) {
    EXPECT_TRUE(check.value("passed", false)) << check.value("detail", "");
    std::cout << "packing_invariance: " << check.value("detail", "") << "\n";
    const json& placements = check["evidence"]["placements"];
    ASSERT_EQ(placements.size(), 5u) << placements.dump();  // alone, 2 caps, split, unsharded
    EXPECT_EQ(placements[0].value("microbatches", 0), 5);   // alone: one per sequence
    EXPECT_NE(placements[1].value("microbatches", 0), placements[2].value("microbatches", 0));
    EXPECT_EQ(placements[3].value("out_of_memory_injected", 0), 1);
    EXPECT_EQ(placements[3].value("microbatches", 0), placements[1].value("microbatches", 0) + 1);
    for (const json& p : placements) EXPECT_TRUE(p.value("reproduced", false)) << p.dump();
    for (const json& p : placements) {
      for (const json& d : p.value("differences_from_alone", json::array())) {
        // Named, with how much: the first module (or the caller's loss head) and its figures.
        EXPECT_FALSE(d.value("first_module", "").empty()) << d.dump();
        EXPECT_GT(d["figures"].value("max_abs_diff", 0.0), 0.0) << d.dump();
      }
    }
  }
}

TEST(PackingInvarianceTest, ANondeterministicModuleIsNotMistakenForPlacement) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(TempDir dir, TempDir::Make("packing_control"));
  for (const json& check :
       RunWorld(1, 1, 2, NegativeControl::kNondeterministicOp, Which::kPacking, dir.path())) {
    EXPECT_FALSE(check.value("passed", true));
    EXPECT_THAT(check.value("detail", ""), HasSubstr("not reproducible"));
    EXPECT_THAT(check.value("detail", ""), HasSubstr(kNondeterministicModule));
  }
}

// Under placement-invariant mode the same placements give every sequence the same bits, alone,
// under either cap, split and unsharded, and the step the same gradients: the check passes only
// so.
TEST(PackingInvarianceTest, UnderPlacementInvariantModeEveryPlacementGivesTheSameBits) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(TempDir dir, TempDir::Make("packing_invariant"));
  for (const json& check : RunWorld(1, 1, 2, NegativeControl::kNone, Which::kPacking, dir.path(),
                                    /*placement_invariant=*/true)) {
    EXPECT_TRUE(check.value("passed", false)) << check.value("detail", "");
    // The outputs, the loss and, summed exactly over calls and the CP group, every parameter's
    // gradient (the embedding, 2 x 6 block weights, the head).
    EXPECT_THAT(check.value("detail", ""),
                HasSubstr("bit-identical across 5 placements (and the step's 14 gradients) under "
                          "placement-invariant mode"));
    EXPECT_TRUE(check["evidence"].value("placement_invariant_mode", false));
    EXPECT_TRUE(check["evidence"]["placement_dependent"].empty())
        << check["evidence"]["placement_dependent"].dump();
  }
}

// The control: LibTorch's attention inside the mode. The check fails, naming the first module
// whose rows depend on the placement.
TEST(PackingInvarianceTest, UnderTheModeLibTorchsAttentionFailsNamingItsModule) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(TempDir dir, TempDir::Make("packing_invariant_control"));
  for (const json& check : RunWorld(1, 1, 2, NegativeControl::kLibTorchAttention, Which::kPacking,
                                    dir.path(), /*placement_invariant=*/true)) {
    EXPECT_FALSE(check.value("passed", true));
    EXPECT_THAT(check.value("detail", ""),
                HasSubstr("placement-dependent under placement-invariant mode"));
    EXPECT_THAT(check.value("detail", ""), HasSubstr("first differs at block0.attention"));
  }
}

}  // namespace
}  // namespace qualification
}  // namespace lockstep
