#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>

#include "ATen/ATen.h"
#include "base/file_io.h"
#include "base/json.h"
#include "base/sha256.h"
#include "base/status_testutil.h"
#include "base/temp_dir.h"
#include "gtest/gtest.h"
#include "replay/state_capture.h"
#include "replay/state_replay.h"
#include "rng/model_stream.h"
#include "rng/named_streams.h"
#include "rng/rank_streams.h"
#include "torch/optim/adamw.h"

namespace lockstep {
namespace replay {
namespace {

// A tiny training state: two weights, a buffer, AdamW after one step, the rank's streams.
struct TinyState {
  at::Tensor w, b, running;
  std::unique_ptr<torch::optim::AdamW> adam;
  std::shared_ptr<rng::RankStreams> streams;

  TinyState() {
    at::manual_seed(7);
    w = at::randn({3, 4}).requires_grad_();
    b = at::zeros({4}).requires_grad_();
    running = at::arange(4, at::kFloat);
    adam = std::make_unique<torch::optim::AdamW>(std::vector<at::Tensor>{w, b},
                                                 torch::optim::AdamWOptions(1e-2));
    streams = rng::RankStreams::Create(rng::DefaultGenerators::CpuOnly()).value();
  }
  void Step() {
    adam->zero_grad();
    (at::matmul(at::randn({2, 3}), w) + b).pow(2).sum().backward();
    adam->step();
  }
  CaptureComponents Components(int64_t position) const {
    CaptureComponents c;
    c.weights = {{"w", w}, {"b", b}, {"running", running}};
    c.optimizer = adam.get();
    c.streams = streams.get();
    c.data_position = position;
    c.absent["ledger"] = "the test keeps no ledger";
    return c;
  }
};

class StateReplayTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = std::make_unique<TempDir>(TempDir::Make("replay").value()); }
  std::string Root(const std::string& name) const { return dir_->path() + "/" + name; }
  std::unique_ptr<TempDir> dir_;
};

TEST_F(StateReplayTest, CapturesEveryComponentInCaptureOrder) {
  TinyState s;
  s.Step();
  LOCKSTEP_ASSERT_OK(WriteStateCapture(Root("a"), 1, 0, 1, s.Components(1)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LoadedCapture c,
                                LoadStateCapture(CaptureDirectory(Root("a"), 1, 0), {1, 0, 1}));
  std::vector<std::string> names;
  for (const auto& entry : c.state.entries()) names.push_back(entry.name);
  ASSERT_GE(names.size(), 11u);
  EXPECT_EQ(names.front(), "data/position");
  EXPECT_EQ(names[1], "rng/caller/cpu");
  EXPECT_NE(std::find(names.begin(), names.end(), "optimizer/w/exp_avg_sq"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "optimizer/b/step"), names.end());
  EXPECT_EQ(names[names.size() - 2], "gradients/w");
  EXPECT_EQ(names.back(), "gradients/b");
  EXPECT_EQ(c.index["components"]["ledger"]["reason"], "the test keeps no ledger");
  EXPECT_EQ(c.index["no_gradient"], nlohmann::json::array({"running"}));
  // Never overwritten.
  EXPECT_EQ(WriteStateCapture(Root("a"), 1, 0, 1, s.Components(1)).code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(StateReplayTest, AComponentLeftOutNeedsAReason) {
  TinyState s;
  CaptureComponents c = s.Components(0);
  c.absent.clear();
  const absl::Status missing = WriteStateCapture(Root("a"), 0, 0, 1, c);
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(missing.message()).find("'ledger' is missing without a reason"),
            std::string::npos)
      << missing;
  c.absent["optimizer"] = "but it is given";
  c.absent["ledger"] = "none";
  EXPECT_EQ(WriteStateCapture(Root("b"), 0, 0, 1, c).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteStateCapture(Root("c"), 0, 2, 2, s.Components(0)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(StateReplayTest, TheSameStateMatchesAndTheFirstDifferingByteIsNamed) {
  TinyState s;
  s.Step();
  LOCKSTEP_ASSERT_OK(WriteStateCapture(Root("a"), 1, 0, 1, s.Components(1)));
  LOCKSTEP_ASSERT_OK(WriteStateCapture(Root("b"), 1, 0, 1, s.Components(1)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RunComparison same, CompareRuns(Root("a"), Root("b"), 1, 1, 1));
  EXPECT_FALSE(same.first.has_value());
  EXPECT_EQ(same.captures, 1);

  // Element 6 of w (row 1, column 2) changed by one ulp: byte 24 of its data.
  s.w.detach().view({-1})[6].copy_(
      at::nextafter(s.w.detach().view({-1})[6], at::scalar_tensor(1e9)));
  LOCKSTEP_ASSERT_OK(WriteStateCapture(Root("c"), 1, 0, 1, s.Components(1)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RunComparison differ, CompareRuns(Root("a"), Root("c"), 1, 1, 1));
  ASSERT_TRUE(differ.first.has_value());
  EXPECT_EQ(differ.first->path, "weights/w");
  EXPECT_EQ(differ.first->kind, "bytes");
  EXPECT_EQ(differ.first->byte_offset, 24);
  EXPECT_EQ(differ.first->element_index, 6);
  EXPECT_EQ(differ.first->differing_elements, 1);
  EXPECT_EQ(differ.first->differing_paths, std::vector<std::string>{"weights/w"});
  EXPECT_NE(differ.first->a_value, differ.first->b_value);
}

TEST_F(StateReplayTest, AnRngStreamThatMovedIsNamedBeforeTheWeights) {
  TinyState s;
  s.Step();
  LOCKSTEP_ASSERT_OK(WriteStateCapture(Root("a"), 1, 0, 1, s.Components(1)));
  at::randn({1});  // the caller's CPU generator moves on
  s.w.detach().add_(1);
  LOCKSTEP_ASSERT_OK(WriteStateCapture(Root("b"), 1, 0, 1, s.Components(1)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RunComparison c, CompareRuns(Root("a"), Root("b"), 1, 1, 1));
  ASSERT_TRUE(c.first.has_value());
  EXPECT_EQ(c.first->path, "rng/caller/cpu");
  EXPECT_EQ(c.first->differing_paths, (std::vector<std::string>{"rng/caller/cpu", "weights/w"}));
}

// A path only one capture has is a difference, whichever side has it.
TEST_F(StateReplayTest, APathOnlyOneCaptureHasIsNamedEitherWay) {
  TinyState s;
  s.Step();
  LOCKSTEP_ASSERT_OK(WriteStateCapture(Root("a"), 1, 0, 1, s.Components(1)));
  CaptureComponents more = s.Components(1);
  more.weights.push_back({"extra", at::zeros({2})});
  LOCKSTEP_ASSERT_OK(WriteStateCapture(Root("b"), 1, 0, 1, more));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RunComparison ab, CompareRuns(Root("a"), Root("b"), 1, 1, 1));
  ASSERT_TRUE(ab.first.has_value());
  EXPECT_EQ(ab.first->path, "weights/extra");
  EXPECT_EQ(ab.first->kind, "only_in_b");
  EXPECT_EQ(ab.first->differing_paths, std::vector<std::string>{"weights/extra"});
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RunComparison ba, CompareRuns(Root("b"), Root("a"), 1, 1, 1));
  ASSERT_TRUE(ba.first.has_value());
  EXPECT_EQ(ba.first->path, "weights/extra");
  EXPECT_EQ(ba.first->kind, "only_in_a");
}

// The model stream and every named stream are captured, and one that moved is named alone.
TEST_F(StateReplayTest, TheModelAndNamedStreamsAreCapturedAndCompared) {
  TinyState s;
  LOCKSTEP_ASSERT_OK(s.streams->named().Add("data", 5));
  auto draw_on_model_stream = [&] {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(rng::ModelStreamScope scope,
                                  rng::ModelStreamScope::Enter(*s.streams));
    at::rand({1});
    LOCKSTEP_ASSERT_OK(scope.Exit());
  };
  draw_on_model_stream();
  LOCKSTEP_ASSERT_OK(WriteStateCapture(Root("a"), 1, 0, 1, s.Components(1)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LoadedCapture a,
                                LoadStateCapture(CaptureDirectory(Root("a"), 1, 0), {1, 0, 1}));
  for (const char* path : {"rng/model/cpu", "rng/named/data/seed", "rng/named/data/cpu"}) {
    EXPECT_NE(a.state.Find(path), nullptr) << path << " was not captured";
  }
  draw_on_model_stream();  // the model stream moves on; the caller's is restored by the scope
  LOCKSTEP_ASSERT_OK(WriteStateCapture(Root("b"), 1, 0, 1, s.Components(1)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RunComparison model, CompareRuns(Root("a"), Root("b"), 1, 1, 1));
  ASSERT_TRUE(model.first.has_value());
  EXPECT_EQ(model.first->path, "rng/model/cpu");
  EXPECT_EQ(model.first->differing_paths, std::vector<std::string>{"rng/model/cpu"});
  {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(rng::NamedStreamFork fork, s.streams->named().Fork("data"));
    at::rand({1});
    LOCKSTEP_ASSERT_OK(fork.Exit());
  }
  LOCKSTEP_ASSERT_OK(WriteStateCapture(Root("c"), 1, 0, 1, s.Components(1)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(RunComparison named, CompareRuns(Root("b"), Root("c"), 1, 1, 1));
  ASSERT_TRUE(named.first.has_value());
  EXPECT_EQ(named.first->path, "rng/named/data/cpu");
  EXPECT_EQ(named.first->differing_paths, std::vector<std::string>{"rng/named/data/cpu"});
}

TEST_F(StateReplayTest, PartialOrDamagedOrMissingEvidenceIsRefused) {
  TinyState s;
  s.Step();
  LOCKSTEP_ASSERT_OK(WriteStateCapture(Root("a"), 1, 0, 1, s.Components(1)));
  LOCKSTEP_ASSERT_OK(WriteStateCapture(Root("b"), 1, 0, 1, s.Components(1)));
  const std::string b = CaptureDirectory(Root("b"), 1, 0);
  // Truncated state file.
  const std::string state = ReadFileToString(b + "/state.safetensors", 1 << 20).value();
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(b + "/state.safetensors", state.substr(0, 100)));
  EXPECT_EQ(CompareRuns(Root("a"), Root("b"), 1, 1, 1).status().code(),
            absl::StatusCode::kDataLoss);
  // A rank that did not complete.
  LOCKSTEP_ASSERT_OK(WriteFileAtomically(b + "/state.safetensors", state));
  ASSERT_EQ(std::remove((b + "/complete.json").c_str()), 0);
  const absl::Status partial = CompareRuns(Root("a"), Root("b"), 1, 1, 1).status();
  EXPECT_EQ(partial.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(partial.message()).find("partial"), std::string::npos) << partial;
  // A step never captured.
  EXPECT_EQ(CompareRuns(Root("a"), Root("a"), 1, 2, 1).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(StateReplayTest, CapturesOfIncompatibleRunsAreRefused) {
  TinyState s;
  s.Step();
  LOCKSTEP_ASSERT_OK(WriteStateCapture(Root("a"), 1, 0, 1, s.Components(1)));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(LoadedCapture a,
                                LoadStateCapture(CaptureDirectory(Root("a"), 1, 0), {1, 0, 1}));
  LoadedCapture b = a;
  b.context["stable"]["lockstep_commit"] = "another-build";
  const absl::Status s2 = CompareCaptures(a, b).status();
  EXPECT_EQ(s2.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(s2.message()).find("lockstep_commit"), std::string::npos) << s2;
}

// Rewrites a capture's index.json through `edit` and seals it again (complete.json's
// index_sha256), as a hostile user can: the seal proves the files belong together, not that what
// they say is true.
void Reseal(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json index =
      ParseJson(ReadFileToString(dir + "/index.json", 1 << 20).value(), "").value();
  edit(index);
  const std::string text = DumpJson(index);
  nlohmann::json complete =
      ParseJson(ReadFileToString(dir + "/complete.json", 1 << 20).value(), "").value();
  Sha256Hasher hasher;
  hasher.Append(text);
  complete["index_sha256"] = DigestHex(hasher.Finish());
  ASSERT_TRUE(WriteFileAtomically(dir + "/index.json", text).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/complete.json", DumpJson(complete)).ok());
}

// Note [A capture against its place]: what a capture says of itself is checked against where it
// sits and what its run declared; anything else is refused, never compared.
TEST_F(StateReplayTest, ACaptureIsCheckedAgainstItsPlace) {
  TinyState s;
  s.Step();
  for (const char* run : {"a", "b"}) {
    for (int rank = 0; rank < 2; ++rank) {
      LOCKSTEP_ASSERT_OK(WriteStateCapture(Root(run), 1, rank, 2, s.Components(1)));
    }
  }
  LOCKSTEP_ASSERT_OK(CompareRuns(Root("a"), Root("b"), 1, 1, 2).status());
  auto refused = [&](const std::string& b_root, int world, const std::string& says) {
    const absl::Status status = CompareRuns(Root("a"), b_root, 1, 1, world).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(std::string(status.message()).find(says), std::string::npos) << status;
  };
  // A two-rank run read as one rank.
  refused(Root("b"), 1, "world_size 2");
  // Another run's captures linked in.
  ASSERT_EQ(mkdir(Root("c").c_str(), 0755), 0);
  ASSERT_EQ(symlink((Root("b") + "/step1").c_str(), (Root("c") + "/step1").c_str()), 0);
  refused(Root("c"), 2, "symbolic link");
  // A relabelled rank: rank 0's capture in rank 1's folder.
  const std::string rank0 = CaptureDirectory(Root("b"), 1, 0);
  const std::string rank1 = CaptureDirectory(Root("b"), 1, 1);
  for (const char* file : {"/index.json", "/complete.json", "/state.safetensors"}) {
    LOCKSTEP_ASSERT_OK(
        WriteFileAtomically(rank1 + file, ReadFileToString(rank0 + file, 1 << 20).value()));
  }
  refused(Root("b"), 2, "rank 0");
  // Fields of the wrong type, missing, or of another format, sealed again.
  for (const auto& [edit, says] :
       std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>>{
           {[](nlohmann::json& j) { j["step"] = "1"; }, "step"},
           {[](nlohmann::json& j) { j["context"] = 7; }, "context"},
           {[](nlohmann::json& j) { j.erase("components"); }, "components"},
           {[](nlohmann::json& j) { j["components"]["rng"]["present"] = "yes"; }, "present"},
           {[](nlohmann::json& j) {
              j["paths"] = {1, 2};
            },
            "paths"},
           {[](nlohmann::json& j) { j["format"] = "lockstep.state_capture/2"; }, "format"}}) {
    LOCKSTEP_ASSERT_OK(WriteStateCapture(Root("d"), 1, 0, 1, s.Components(1)));
    Reseal(CaptureDirectory(Root("d"), 1, 0), edit);
    const absl::Status status = CompareRuns(Root("d"), Root("d"), 1, 1, 1).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(std::string(status.message()).find(says), std::string::npos) << status;
    // RemoveTree (nftw), not std::filesystem::remove_all: the latter crashes on the GPU
    // machine's newer libstdc++ when built here (see host_lane_test.cc).
    RemoveTree(Root("d"));
    ASSERT_NE(access(Root("d").c_str(), F_OK), 0);
  }
}

}  // namespace
}  // namespace replay
}  // namespace lockstep
