// The operator recorder (numerics/op_recorder.h) on the reference model run through TrainerRank:
//   - under the variability checks' nondeterministic-op control (kNondeterministicModule), two
//     recordings of one step (forward and backward) name the operator that computes different
//     bits from the same inputs, and its module: lockstep_controls::shuffled_sum on the CPU,
//     aten::index_add_ (floating-point atomics) on CUDA; without the control they are identical;
//   - a sequence forwarded alone and packed among the fixed batch's others, recorded through a
//     row window on its rows, first differs at an operator of block0.attention whose inputs
//     matched on the sequence's rows: the first result that depends on the placement.
// Built twice: //qualification:operator_localization_test on the CPU and, with
// LOCKSTEP_OPERATORS_ON_CUDA, //qualification:operator_localization_cuda_test (gpu).

#include <cstdlib>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "absl/strings/str_cat.h"
#include "base/status_testutil.h"
#include "base/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "invariant/mode.h"
#include "nlohmann/json.hpp"
#include "numerics/deterministic_mode.h"
#include "numerics/op_divergence.h"
#include "numerics/op_recorder.h"
#include "numerics/shuffled_sum.h"
#include "qualification/reference_model.h"
#include "qualification/variability.h"
#include "qualification/variability_program.h"

namespace lockstep {
namespace qualification {
namespace {

// Options recording only `window`'s rows.
numerics::OperatorRecorderOptions Window(numerics::RowWindow window) {
  numerics::OperatorRecorderOptions options;
  options.row_window = window;
  return options;
}

using ::testing::HasSubstr;

#ifdef LOCKSTEP_OPERATORS_ON_CUDA
const c10::Device kDevice(c10::kCUDA, 0);
constexpr const char* kControlOperator = "aten::index_add_";
#else
const c10::Device kDevice(c10::kCPU);
constexpr const char* kControlOperator = numerics::controls::kShuffledSumOperator;
#endif

// Opens a recorder Scope labelled with the module at each module's entry and closes it at its
// exit: operator calls inside a module are recorded under its name.
class ScopeTaps : public ModuleTaps {
 public:
  explicit ScopeTaps(numerics::OperatorRecorder& recorder) : recorder_(recorder) {}
  at::Tensor Enter(const std::string& module, const at::Tensor& input) override {
    open_.push_back(module);
    scopes_.push_back(std::make_unique<numerics::OperatorRecorder::Scope>(recorder_, module));
    return input;
  }
  at::Tensor Exit(const std::string& module, const at::Tensor& output, const at::Tensor&,
                  const at::Tensor&) override {
    if (!open_.empty() && open_.back() == module) {  // "embedding" has no Enter
      scopes_.pop_back();
      open_.pop_back();
    }
    return output;
  }

 private:
  numerics::OperatorRecorder& recorder_;
  std::vector<std::string> open_;
  std::vector<std::unique_ptr<numerics::OperatorRecorder::Scope>> scopes_;
};

class OperatorLocalizationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    numerics::PrepareCublasForDeterminism();  // before the first cuBLAS call
    absl::StatusOr<TempDir> dir = TempDir::Make("operator_localization_test");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = std::make_unique<TempDir>(*std::move(dir));
    groups_.device = kDevice;
  }

  // A fresh program for `placement`, one step of `inputs` recorded into `name`: with
  // `whole_step`, every call of the forward and backward (under "step" outside the modules);
  // otherwise the calls inside the model's modules only. Fills `*microbatches` when given.
  numerics::OperatorRecording Record(
      const std::string& name, variability::Placement placement, trainer::TrainerInputs inputs,
      bool whole_step, numerics::OperatorRecorderOptions options,
      std::vector<trainer::MicrobatchOutput>* microbatches = nullptr) {
    placement.unsharded = true;
    absl::StatusOr<std::unique_ptr<variability::Program>> program =
        variability::MakeProgram(groups_, placement);
    EXPECT_TRUE(program.ok()) << program.status();
    if (!program.ok()) return numerics::OperatorRecording(0, {});
    const std::string path = absl::StrCat(dir_->path(), "/", name, ".jsonl");
    absl::StatusOr<std::unique_ptr<numerics::OperatorRecorder>> recorder =
        numerics::OperatorRecorder::Create(path, options);
    EXPECT_TRUE(recorder.ok()) << recorder.status();
    if (!recorder.ok()) return numerics::OperatorRecording(0, {});
    (*program)->model->SetTaps(std::make_shared<ScopeTaps>(**recorder));
    {
      std::unique_ptr<numerics::OperatorRecorder::Scope> step;
      if (whole_step)
        step = std::make_unique<numerics::OperatorRecorder::Scope>(**recorder, "step");
      absl::StatusOr<variability::StepResult> result =
          variability::Step(**program, std::move(inputs), /*backward=*/whole_step);
      EXPECT_TRUE(result.ok()) << result.status();
      if (result.ok() && microbatches != nullptr) *microbatches = result->microbatches;
    }
    (*program)->model->SetTaps(nullptr);
    LOCKSTEP_EXPECT_OK((*recorder)->Close());
    absl::StatusOr<numerics::OperatorRecording> loaded = numerics::OperatorRecording::Load(path);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? *std::move(loaded) : numerics::OperatorRecording(0, {});
  }

  std::unique_ptr<TempDir> dir_;
  variability::ProgramGroups groups_;
  DeterministicMode deterministic_;
};

TEST_F(OperatorLocalizationTest, NamesTheControlsNondeterministicOperatorAndItsModule) {
  variability::Placement placement;
  placement.broken_module = kNondeterministicModule;
  const numerics::OperatorRecording a = Record("a", placement, variability::FixedBatch(0),
                                               /*whole_step=*/true, {});
  const numerics::OperatorRecording b = Record("b", placement, variability::FixedBatch(0),
                                               /*whole_step=*/true, {});
  const numerics::OperatorDivergence d = numerics::FirstOperatorDivergence(a, b);
  ASSERT_TRUE(d.first_outputs_differ.has_value()) << numerics::OperatorDivergenceJson(d).dump(1);
  const numerics::OperatorFinding& f = *d.first_outputs_differ;
  EXPECT_EQ(f.op, kControlOperator);
  EXPECT_EQ(f.module, kNondeterministicModule);
  EXPECT_EQ(f.reason, "outputs digest");
  ASSERT_FALSE(f.figures.empty());
  EXPECT_NE(f.figures[0].sum_a, f.figures[0].sum_b);
  // The difference flows on into later calls (the residue's add), not in from outside.
  ASSERT_TRUE(d.first_inputs_differ.has_value());
  EXPECT_GT(d.first_inputs_differ->index, f.index);
  EXPECT_FALSE(d.entered_after.has_value());
  EXPECT_FALSE(d.misaligned_at.has_value()) << numerics::OperatorDivergenceSummary(d);
  EXPECT_THAT(numerics::OperatorDivergenceSummary(d),
              HasSubstr(absl::StrCat(kControlOperator, " in ", kNondeterministicModule)));
  // Backward calls were recorded too (the walk compared them up to the finding's index).
  EXPECT_GT(a.records().size(), static_cast<size_t>(f.index) + 20);
}

TEST_F(OperatorLocalizationTest, WithoutTheControlTheRecordingsAreIdentical) {
  const numerics::OperatorRecording a = Record("a", {}, variability::FixedBatch(0),
                                               /*whole_step=*/true, {});
  const numerics::OperatorRecording b = Record("b", {}, variability::FixedBatch(0),
                                               /*whole_step=*/true, {});
  ASSERT_GT(a.records().size(), 50u);
  const numerics::OperatorDivergence d = numerics::FirstOperatorDivergence(a, b);
  EXPECT_FALSE(d.diverged()) << numerics::OperatorDivergenceSummary(d);
}

// Whether this device's at::mm computes rows [begin, begin + length) of a [total, kWidth] x
// [kWidth, kWidth] product (the reference model's query projection) other than bit for bit as
// the product of those rows alone: an independent probe of the placement dependence that the
// recorder must find, on random values of the same shapes.
bool ProductRowsDependOnPlacement(int64_t total, int64_t begin, int64_t length) {
  constexpr int64_t kWidth = ReferenceModel::kWidth;
  at::Generator generator = at::detail::createCPUGenerator(7);
  const at::Tensor x = at::randn({total, kWidth}, generator, at::kFloat).to(kDevice);
  const at::Tensor w = at::randn({kWidth, kWidth}, generator, at::kFloat).to(kDevice);
  const at::Tensor packed = at::mm(x, w.t()).slice(0, begin, begin + length);
  const at::Tensor alone = at::mm(x.slice(0, begin, begin + length).clone(), w.t());
  return !at::equal(packed, alone);
}

// Whether this device's softmax over a row of `total` keys, all but `length` of them masked to
// -inf, differs from the softmax over those `length` keys alone (the attention's shape).
[[maybe_unused]] bool SoftmaxRowsDependOnPlacement(int64_t total, int64_t begin, int64_t length) {
  at::Generator generator = at::detail::createCPUGenerator(11);
  const at::Tensor scores = at::randn({length, length}, generator, at::kFloat).to(kDevice);
  at::Tensor wide =
      at::full({length, total}, -std::numeric_limits<float>::infinity(), scores.options());
  wide.slice(1, begin, begin + length).copy_(scores);
  const at::Tensor packed = at::softmax(wide, 1).slice(1, begin, begin + length);
  return !at::equal(packed, at::softmax(scores, 1));
}

// Each sequence of the fixed batch forwarded alone and packed with the other four (55 tokens,
// one microbatch under a 64-token budget), recorded through a row window on its rows. Dropout
// off: each forward draws its own masks.
TEST_F(OperatorLocalizationTest, NamesTheFirstOperatorWhoseOutputDependsOnThePlacement) {
  const trainer::TrainerInputs batch = variability::FixedBatch(0);
  const std::vector<int64_t> offsets = variability::SequenceOffsets(batch);
  variability::Placement placement;
  placement.budget = 64;
  placement.dropout = false;
  // Where the planner put each sequence's rows in the packed microbatch.
  std::vector<trainer::MicrobatchOutput> packed;
  Record("plan", placement, batch, /*whole_step=*/false, {}, &packed);
  ASSERT_EQ(packed.size(), 1u);
  const at::Tensor input_rows = packed[0].input_rows.to(at::kCPU);
  const int64_t total = input_rows.size(0);
  int findings = 0;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const int64_t length = batch.sequences[s].num_tokens;
    const trainer::TrainerInputs alone = trainer::TrainerInputs::Of(
        {batch.sequences[s]}, batch.rows.slice(0, offsets[s], offsets[s] + length).clone());
    const int64_t begin = (input_rows == offsets[s]).nonzero().item<int64_t>();
    ASSERT_TRUE(at::equal(input_rows.slice(0, begin, begin + length),
                          at::arange(offsets[s], offsets[s] + length, input_rows.options())));
    const numerics::OperatorRecording a = Record(absl::StrCat("alone", s), placement, alone,
                                                 /*whole_step=*/false, Window({length, 0, length}));
    const numerics::OperatorRecording b =
        Record(absl::StrCat("packed", s), placement, batch, /*whole_step=*/false,
               Window({total, begin, begin + length}));
    const numerics::OperatorDivergence d = numerics::FirstOperatorDivergence(a, b);
    std::cout << "sequence " << s << " (" << length << " tokens, rows " << begin << ".."
              << begin + length << " of " << total
              << "): " << numerics::OperatorDivergenceSummary(d) << "\n";
    EXPECT_FALSE(d.misaligned_at.has_value()) << s;
    // What else is packed enters only through the operators: never between them.
    EXPECT_FALSE(d.entered_after.has_value()) << s;
    if (!d.first_outputs_differ) continue;
    ++findings;
    const numerics::OperatorFinding& f = *d.first_outputs_differ;
    // Every call before it matched on the sequence's rows, inputs and outputs.
    for (int64_t i = 0; i < f.index; ++i) {
      if (a.records()[i].depth > 0) continue;
      EXPECT_EQ(a.records()[i].inputs_digest, b.records()[i].inputs_digest) << s << " " << i;
      EXPECT_EQ(a.records()[i].outputs_digest, b.records()[i].outputs_digest) << s << " " << i;
    }
#ifndef LOCKSTEP_OPERATORS_ON_CUDA
    // On the CPU, the 7-token sequence packed after 43 other tokens. Where the BLAS computes a
    // row of a matrix product the same whatever the rows around it (the probe says), the first
    // call to depend on the placement is the softmax over its rows' 55 keys (48 of them masked
    // to -inf), which rounds differently from one over its 7 keys; where it does not (some
    // BLAS take the last rows of a 55-row product through another kernel), it is the block's
    // first product, the queries.
    if (s == 1) {
      if (ProductRowsDependOnPlacement(total, begin, length)) {
        EXPECT_EQ(f.op, "aten::mm");
      } else {
        EXPECT_EQ(f.op, "aten::softmax");
        EXPECT_EQ(f.inner_op, "aten::_softmax");
      }
      EXPECT_EQ(f.module, "block0.attention");
      EXPECT_EQ(f.reason, "outputs digest");
      ASSERT_FALSE(f.figures.empty());
      EXPECT_NE(f.figures[0].sum_diff, 0.0);
    }
#endif
  }
#ifndef LOCKSTEP_OPERATORS_ON_CUDA
  EXPECT_GE(findings, 1);
#else
  // On a GPU the kernels may or may not depend on the placement: the probes of the first
  // operators that could say so decide whether there is anything to find.
  bool placement_matters = false;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const int64_t length = batch.sequences[s].num_tokens;
    const int64_t begin = (input_rows == offsets[s]).nonzero().item<int64_t>();
    placement_matters = placement_matters || ProductRowsDependOnPlacement(total, begin, length) ||
                        SoftmaxRowsDependOnPlacement(total, begin, length);
  }
  if (!placement_matters) {
    GTEST_SKIP() << "this device's mm and softmax give a sequence's rows the same bits wherever "
                    "it is packed: nothing to localize";
  }
  EXPECT_GE(findings, 1) << "the probes found a placement dependence the recorder did not";
#endif
}

// Under placement-invariant mode (invariant/mode.h), each sequence forwarded alone and packed
// with the batch's others: recorded through a row window on its rows, the recordings never
// diverge; with the libtorch-attention control (LibTorch's attention inside the mode), the
// first operator whose output depends on the placement is named in block0.attention.
class PlacementInvariantLocalizationTest : public OperatorLocalizationTest {
 protected:
  // Per sequence of the fixed batch: the divergence of its alone recording from its packed one.
  std::vector<numerics::OperatorDivergence> AloneAgainstPacked(bool libtorch_attention,
                                                               int64_t* total_rows,
                                                               std::vector<int64_t>* begins) {
    const invariant::PlacementInvariantScope mode;
    const trainer::TrainerInputs batch = variability::FixedBatch(0);
    const std::vector<int64_t> offsets = variability::SequenceOffsets(batch);
    variability::Placement placement;
    placement.budget = 64;
    placement.dropout = false;
    placement.libtorch_attention = libtorch_attention;
    std::vector<trainer::MicrobatchOutput> packed;
    Record("plan", placement, batch, /*whole_step=*/false, {}, &packed);
    EXPECT_EQ(packed.size(), 1u);
    if (packed.size() != 1) return {};
    const at::Tensor input_rows = packed[0].input_rows.to(at::kCPU);
    const int64_t total = input_rows.size(0);
    *total_rows = total;
    std::vector<numerics::OperatorDivergence> out;
    for (size_t s = 0; s < batch.sequences.size(); ++s) {
      const int64_t length = batch.sequences[s].num_tokens;
      const trainer::TrainerInputs alone = trainer::TrainerInputs::Of(
          {batch.sequences[s]}, batch.rows.slice(0, offsets[s], offsets[s] + length).clone());
      const int64_t begin = (input_rows == offsets[s]).nonzero().item<int64_t>();
      begins->push_back(begin);
      const numerics::OperatorRecording a =
          Record(absl::StrCat("alone", s), placement, alone, /*whole_step=*/false,
                 Window({length, 0, length}));
      const numerics::OperatorRecording b =
          Record(absl::StrCat("packed", s), placement, batch, /*whole_step=*/false,
                 Window({total, begin, begin + length}));
      out.push_back(numerics::FirstOperatorDivergence(a, b));
      std::cout << (libtorch_attention ? "control: " : "mode: ") << "sequence " << s << ": "
                << numerics::OperatorDivergenceSummary(out.back()) << "\n";
    }
    return out;
  }
};

TEST_F(PlacementInvariantLocalizationTest, UnderTheModeNoOperatorDependsOnThePlacement) {
  int64_t total = 0;
  std::vector<int64_t> begins;
  const std::vector<numerics::OperatorDivergence> divergences =
      AloneAgainstPacked(/*libtorch_attention=*/false, &total, &begins);
  ASSERT_EQ(divergences.size(), 5u);
  for (const numerics::OperatorDivergence& d : divergences) {
    EXPECT_FALSE(d.diverged()) << numerics::OperatorDivergenceSummary(d);
  }
}

TEST_F(PlacementInvariantLocalizationTest, LibTorchsAttentionInsideTheModeIsNamedByItsOperator) {
  int64_t total = 0;
  std::vector<int64_t> begins;
  const std::vector<numerics::OperatorDivergence> divergences =
      AloneAgainstPacked(/*libtorch_attention=*/true, &total, &begins);
  ASSERT_EQ(divergences.size(), 5u);
  int findings = 0;
  for (size_t s = 0; s < divergences.size(); ++s) {
    const numerics::OperatorDivergence& d = divergences[s];
    EXPECT_FALSE(d.misaligned_at.has_value()) << s;
    if (!d.first_outputs_differ) continue;
    ++findings;
    // The mode's own kernels agree; the first result to depend on the placement is LibTorch's,
    // in an attention it was swapped into (the first block's, or the second's where the first
    // happened to round alike): its scores' product or their softmax.
    const numerics::OperatorFinding& f = *d.first_outputs_differ;
    EXPECT_TRUE(f.module == "block0.attention" || f.module == "block1.attention") << f.module;
    EXPECT_TRUE(f.op == "aten::softmax" || f.op == "aten::mm") << f.op;
#ifndef LOCKSTEP_OPERATORS_ON_CUDA
    // On the CPU, as without the mode: the 7-token sequence after 43 others, first at block0.
    if (s == 1) {
      EXPECT_EQ(f.module, "block0.attention");
    }
#endif
  }
  EXPECT_GE(findings, 1) << "the control changed no sequence's bits";
}

}  // namespace
}  // namespace qualification
}  // namespace lockstep
