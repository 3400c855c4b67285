// numerics/inventory: a file's inventory equals its tensors', differences are named, the JSON
// holds every entry, and a module with its optimizer inventories every tensor.

#include "numerics/inventory.h"

#include "ATen/ATen.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "numerics/module_state.h"
#include "torch/torch.h"

namespace lockstep {
namespace numerics {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(InventoryTest, AFileInventoriesAsTheTensorsItHolds) {
  const NamedTensors tensors = {{"b", at::randn({4, 3}).t()}, {"a", at::arange(5)}};
  const std::string path = testing::TempDir() + "/inv.safetensors";
  LOCKSTEP_ASSERT_OK(WriteSafetensors(path, tensors));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(SafetensorsFile file, SafetensorsFile::Open(path));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Inventory from_file, Inventory::OfFile(file));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Inventory from_tensors, Inventory::Of(tensors));
  EXPECT_EQ(from_file.state_digest(), from_tensors.state_digest());
  EXPECT_EQ(from_file.entries()[0].name, "a");  // sorted
  EXPECT_THAT(from_file.entries()[1].strides, ElementsAre(4, 1));
  EXPECT_THAT(from_tensors.entries()[1].strides, ElementsAre(1, 3));  // as held
  EXPECT_EQ(from_file.total_bytes(), 5 * 8 + 12 * 4);
}

TEST(InventoryTest, DifferencesAreNamed) {
  const at::Tensor w = at::randn({3});
  at::Tensor changed = w.clone();
  changed[1] = changed[1].item<float>() + 1;
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(
      Inventory a,
      Inventory::Of({{"same", w}, {"changed", w}, {"dtype", w}, {"shape", w}, {"gone", w}}));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Inventory b, Inventory::Of({{"same", w},
                                                            {"changed", changed},
                                                            {"dtype", w.to(at::kHalf)},
                                                            {"shape", w.reshape({3, 1})},
                                                            {"new", w}}));
  const std::vector<InventoryDifference> diff = CompareInventories(a, b);
  ASSERT_EQ(diff.size(), 5u);
  EXPECT_EQ(diff[0].name, "changed");
  EXPECT_THAT(diff[0].what, HasSubstr("digest "));
  EXPECT_EQ(diff[1].what, "dtype F32 vs F16");
  EXPECT_EQ(diff[2].what, "only in A");
  EXPECT_EQ(diff[3].what, "only in B");
  EXPECT_EQ(diff[4].what, "shape [3] vs [3, 1]");
  const nlohmann::json j = InventoryJson(a);
  EXPECT_EQ(j["digest_version"], 1);
  EXPECT_EQ(j["tensors"], 5);
  EXPECT_EQ(j["entries"][0]["name"], "changed");
  EXPECT_EQ(j["entries"][0]["digest"].get<std::string>().size(), 32u);
  EXPECT_FALSE(Inventory::Of({{"x", w}, {"x", w}}).ok());
}

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(4, 8));
    norm = register_module("norm", torch::nn::BatchNorm1d(8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 2));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(norm(fc1(x)).relu()); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};

TEST(ModuleStateTest, ParametersBuffersAndAdamState) {
  torch::manual_seed(0);
  auto net = std::make_shared<Net>();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(NamedTensors before, ModuleState(*net, &adam));
  // 4 weights/biases of the linears, 2 of the norm, 3 norm buffers; no optimizer state yet.
  EXPECT_EQ(before.size(), 9u);
  net->forward(torch::randn({5, 4})).sum().backward();
  adam.step();
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(NamedTensors after, ModuleState(*net, &adam));
  EXPECT_EQ(after.size(), 9u + 6 * 3);  // step, exp_avg, exp_avg_sq per parameter
  bool found = false;
  for (const auto& [name, tensor] : after) {
    if (name == "optimizer/fc1.weight/exp_avg") found = tensor.sizes() == at::IntArrayRef({8, 4});
  }
  EXPECT_TRUE(found);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Inventory one, Inventory::Of(after));
  // The same model and optimizer state in another registration order: the same digest.
  NamedTensors reversed(after.rbegin(), after.rend());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Inventory two, Inventory::Of(reversed));
  EXPECT_EQ(one.state_digest(), two.state_digest());
}

}  // namespace
}  // namespace numerics
}  // namespace lockstep
