// The operator recorder (numerics/op_recorder.h): a deliberately nondeterministic operator
// registered with the dispatcher (lockstep_controls::shuffled_sum) is named, with its module, as
// the first call whose inputs matched and whose outputs differ, every call before it matching; a
// deterministic computation records identically twice; a placement-dependent operator (a mean
// over every packed row) is named when one sequence is recorded alone and packed among others,
// through a row window; the digest's own calls are not recorded; a malformed recording is refused
// naming its file and line.

#include "numerics/op_recorder.h"
#include "numerics/op_divergence.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status_testutil.h"
#include "base/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "numerics/shuffled_sum.h"

namespace lockstep {
namespace numerics {
namespace {

// Options recording only `window`'s rows.
OperatorRecorderOptions Window(RowWindow window) {
  OperatorRecorderOptions options;
  options.row_window = window;
  return options;
}

using ::testing::HasSubstr;

class OperatorRecorderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<TempDir> dir = TempDir::Make("op_recorder_test");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = std::make_unique<TempDir>(*std::move(dir));
  }

  // Records `run` into a fresh file; returns the recording.
  OperatorRecording Record(const std::string& name, const std::function<void()>& run,
                           OperatorRecorderOptions options = OperatorRecorderOptions()) {
    const std::string path = absl::StrCat(dir_->path(), "/", name, ".jsonl");
    options.flush_every = 7;
    absl::StatusOr<std::unique_ptr<OperatorRecorder>> recorder =
        OperatorRecorder::Create(path, options);
    EXPECT_TRUE(recorder.ok()) << recorder.status();
    if (!recorder.ok()) return OperatorRecording(0, {});
    run_recorder_ = recorder->get();
    run();
    run_recorder_ = nullptr;
    EXPECT_TRUE((*recorder)->Close().ok()) << (*recorder)->status();
    absl::StatusOr<OperatorRecording> loaded = OperatorRecording::Load(path);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? *std::move(loaded) : OperatorRecording(0, {});
  }

  OperatorRecorder& recorder() { return *run_recorder_; }

  std::unique_ptr<TempDir> dir_;
  OperatorRecorder* run_recorder_ = nullptr;
};

// The calls the program made itself (not those inside other calls).
std::vector<OperatorRecord> TopLevel(const OperatorRecording& r) {
  std::vector<OperatorRecord> top;
  for (const OperatorRecord& record : r.records()) {
    if (record.depth == 0) top.push_back(record);
  }
  return top;
}

std::string Ops(const OperatorRecording& r) {
  std::string s;
  for (const OperatorRecord& record : r.records()) {
    absl::StrAppend(&s, record.index, ":", std::string(2 * record.depth, ' '), record.op, "\n");
  }
  return s;
}

at::Tensor Values() { return at::sin(at::arange(48, at::kFloat) * 0.37 + 0.2).reshape({6, 8}); }

// prep: a few elementwise operators; reduce: the cancelling terms summed by `reduce`; after: one
// more operator on the sum.
void Computation(OperatorRecorder& recorder, bool shuffled) {
  const at::Tensor x = Values();
  at::Tensor y;
  {
    OperatorRecorder::Scope scope(recorder, "prep");
    y = at::tanh(x * 3.0 + 1.0);
  }
  at::Tensor sum;
  {
    OperatorRecorder::Scope scope(recorder, "reduce");
    const at::Tensor terms = controls::CancellingTerms(y);
    sum = shuffled ? controls::ShuffledSum(terms) : terms.sum(0);
  }
  {
    OperatorRecorder::Scope scope(recorder, "after");
    sum = sum * 2.0;
  }
}

TEST_F(OperatorRecorderTest, NamesTheNondeterministicOperatorAndItsModule) {
  const OperatorRecording a = Record("a", [&] { Computation(recorder(), /*shuffled=*/true); });
  const OperatorRecording b = Record("b", [&] { Computation(recorder(), /*shuffled=*/true); });
  ASSERT_GT(a.records().size(), 5u);
  const OperatorDivergence d = FirstOperatorDivergence(a, b);
  ASSERT_TRUE(d.first_outputs_differ.has_value()) << OperatorDivergenceJson(d).dump(1);
  const OperatorFinding& f = *d.first_outputs_differ;
  EXPECT_EQ(f.op, controls::kShuffledSumOperator);
  EXPECT_EQ(f.module, "reduce");
  EXPECT_EQ(f.reason, "outputs digest");
  EXPECT_EQ(f.inner_index, -1);
  ASSERT_EQ(f.figures.size(), 1u);
  EXPECT_NE(f.figures[0].sum_a, f.figures[0].sum_b);
  // Every call before it matched, inputs and outputs.
  for (int64_t i = 0; i < f.index; ++i) {
    EXPECT_EQ(a.records()[i].op, b.records()[i].op);
    EXPECT_EQ(a.records()[i].inputs_digest, b.records()[i].inputs_digest) << i;
    EXPECT_EQ(a.records()[i].outputs_digest, b.records()[i].outputs_digest)
        << i << " " << a.records()[i].op;
  }
  // The difference then flows into later calls' inputs: not "entered outside the operators".
  ASSERT_TRUE(d.first_inputs_differ.has_value());
  EXPECT_GT(d.first_inputs_differ->index, f.index);
  EXPECT_EQ(d.first_inputs_differ->module, "after");
  EXPECT_FALSE(d.entered_after.has_value());
  EXPECT_FALSE(d.misaligned_at.has_value());
  EXPECT_THAT(OperatorDivergenceSummary(d), HasSubstr("lockstep_controls::shuffled_sum in reduce"));
  const nlohmann::json j = OperatorDivergenceJson(d);
  EXPECT_EQ(j["first_outputs_differ"]["op"], controls::kShuffledSumOperator);
  EXPECT_TRUE(j["diverged"].get<bool>());
}

TEST_F(OperatorRecorderTest, DeterministicComputationRecordsIdentically) {
  const OperatorRecording a = Record("a", [&] { Computation(recorder(), /*shuffled=*/false); });
  const OperatorRecording b = Record("b", [&] { Computation(recorder(), /*shuffled=*/false); });
  ASSERT_GT(a.records().size(), 5u);
  const OperatorDivergence d = FirstOperatorDivergence(a, b);
  EXPECT_FALSE(d.diverged()) << OperatorDivergenceJson(d).dump(1);
  // The structure a record holds: names, labels, shapes, nesting.
  const OperatorRecord& first = a.records()[0];
  EXPECT_EQ(first.op, "aten::mul");
  EXPECT_EQ(first.module, "prep");
  ASSERT_EQ(first.inputs.size(), 2u);
  EXPECT_EQ(first.inputs[0].kind, "tensor");
  EXPECT_EQ(first.inputs[0].dtype, "F32");
  EXPECT_EQ(first.inputs[0].shape, (std::vector<int64_t>{6, 8}));
  EXPECT_EQ(first.inputs[1].kind, "scalar");
  EXPECT_EQ(first.inputs[1].value, "3");
  ASSERT_EQ(first.outputs.size(), 1u);
  EXPECT_NEAR(first.outputs[0].sum, (Values() * 3.0).sum().item<double>(), 1e-4);
  EXPECT_NEAR(first.outputs[0].max_abs, (Values() * 3.0).abs().max().item<double>(), 1e-6);
}

// An output's figures, read from its bytes on the host, for each kind of dtype: a reduced float
// converted exactly, an integer, and a NaN that makes max |x| NaN while the sum stays a sum.
TEST_F(OperatorRecorderTest, FiguresOfEveryKindOfDtype) {
  const OperatorRecording r = Record("r", [&] {
    OperatorRecorder::Scope scope(recorder(), "step");
    at::Tensor half = at::full({3}, -1.5, at::kBFloat16).neg();
    at::Tensor ints = at::arange(-4, 3, at::kLong).neg();
    at::Tensor with_nan = at::tensor({1.0, NAN, -7.0}, at::kDouble).mul(2.0);
  });
  std::map<std::string, const OperatorRecord*> by_dtype;
  for (const OperatorRecord& record : r.records()) {
    if (record.op != "aten::neg" && record.op != "aten::mul") continue;
    by_dtype[record.outputs.at(0).dtype] = &record;
  }
  ASSERT_EQ(by_dtype.count("BF16"), 1u);
  EXPECT_EQ(by_dtype["BF16"]->outputs[0].sum, 4.5);
  EXPECT_EQ(by_dtype["BF16"]->outputs[0].max_abs, 1.5);
  ASSERT_EQ(by_dtype.count("I64"), 1u);
  EXPECT_EQ(by_dtype["I64"]->outputs[0].sum, 7.0);  // minus the sum of -4 .. 2
  EXPECT_EQ(by_dtype["I64"]->outputs[0].max_abs, 4.0);
  ASSERT_EQ(by_dtype.count("F64"), 1u);
  EXPECT_TRUE(std::isnan(by_dtype["F64"]->outputs[0].sum));
  EXPECT_TRUE(std::isnan(by_dtype["F64"]->outputs[0].max_abs));
}

TEST_F(OperatorRecorderTest, RecordsNothingOutsideAScopeNorItsOwnCalls) {
  const OperatorRecording r = Record("r", [&] {
    at::Tensor outside = Values() + 1.0;  // no scope: not recorded
    OperatorRecorder::Scope scope(recorder(), "step");
    at::Tensor inside = outside * 2.0;
    EXPECT_TRUE(recorder().Flush().ok());  // its digests' own calls are not recorded
    inside = inside - 1.0;
  });
  const std::vector<OperatorRecord> top = TopLevel(r);
  ASSERT_EQ(top.size(), 2u) << Ops(r);
  EXPECT_EQ(top[0].op, "aten::mul");
  EXPECT_EQ(top[1].op, "aten::sub");
}

// A side's digest covers its values, not the operator's name: aten::add_ on ones has the inputs of
// aten::add on ones only if add_'s self was digested before add_ made it twos.
TEST_F(OperatorRecorderTest, InPlaceInputsAreDigestedBeforeTheCallMutatesThem) {
  const OperatorRecording in_place = Record("in_place", [&] {
    at::Tensor t = at::ones({4});
    OperatorRecorder::Scope scope(recorder(), "step");
    t.add_(1.0);
  });
  const OperatorRecording out_of_place = Record("out_of_place", [&] {
    const at::Tensor t = at::ones({4});
    OperatorRecorder::Scope scope(recorder(), "step");
    (void)t.add(1.0);
  });
  const std::vector<OperatorRecord> a = TopLevel(in_place);
  const std::vector<OperatorRecord> b = TopLevel(out_of_place);
  ASSERT_EQ(a.size(), 1u) << Ops(in_place);
  ASSERT_EQ(b.size(), 1u) << Ops(out_of_place);
  EXPECT_EQ(a[0].op, "aten::add_");
  EXPECT_EQ(b[0].op, "aten::add");
  EXPECT_EQ(a[0].inputs_digest, b[0].inputs_digest);
  EXPECT_EQ(a[0].outputs_digest, b[0].outputs_digest);  // twos either way
  EXPECT_EQ(a[0].outputs[0].sum, 8.0);
}

// c10d's Gloo stages a tensor through a fresh storage put under an empty tensor with set_, then
// copied into: whatever the storage held before is not taken for data (Note [Unwritten storage]).
TEST_F(OperatorRecorderTest, AStorageSetUnderATensorIsNotTakenForData) {
  auto run = [&](const std::string& name, uint8_t junk) {
    return Record(name, [&] {
      const at::Tensor x = Values();
      const int64_t bytes = x.numel() * static_cast<int64_t>(sizeof(float));
      c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, at::getCPUAllocator(),
                           /*resizable=*/false);
      std::memset(storage.unsafeGetStorageImpl()->data_ptr().get(), junk,
                  static_cast<size_t>(bytes));
      OperatorRecorder::Scope scope(recorder(), "step");
      at::Tensor staged = at::empty({0}, at::kFloat).set_(storage, 0, x.sizes(), x.strides());
      staged.copy_(x);
      (void)staged.neg();
    });
  };
  const OperatorRecording a = run("a", 0x00);
  const OperatorRecording b = run("b", 0xff);
  const OperatorDivergence d = FirstOperatorDivergence(a, b);
  EXPECT_FALSE(d.diverged()) << OperatorDivergenceSummary(d) << Ops(a);
  bool set_seen = false;
  for (const OperatorRecord& r : a.records()) {
    if (r.op != "aten::set_") continue;
    set_seen = true;
    ASSERT_FALSE(r.outputs.empty());
    EXPECT_EQ(r.outputs[0].kind, "uninitialized");
  }
  EXPECT_TRUE(set_seen) << Ops(a);
}

TEST_F(OperatorRecorderTest, BackwardCallsAreRecorded) {
  const OperatorRecording r = Record("r", [&] {
    at::Tensor w = Values().set_requires_grad(true);
    OperatorRecorder::Scope scope(recorder(), "step");
    (w * w).sum().backward();
  });
  bool saw_backward_mul = false;
  for (size_t i = 2; i < r.records().size(); ++i) {
    if (r.records()[i].op == "aten::mul") saw_backward_mul = true;
  }
  EXPECT_TRUE(saw_backward_mul);
}

// A placement-dependent model: `center` subtracts the mean over every packed row, so a sequence's
// outputs depend on what it is packed with.
void PlacementModel(OperatorRecorder& recorder, const at::Tensor& rows) {
  const at::Tensor w = at::cos(at::arange(4, at::kFloat) * 0.9 + 0.3);
  at::Tensor h;
  {
    OperatorRecorder::Scope scope(recorder, "scale");
    h = rows * w + 0.5;
  }
  {
    OperatorRecorder::Scope scope(recorder, "center");
    h = h - h.mean(0, /*keepdim=*/true);
  }
  {
    OperatorRecorder::Scope scope(recorder, "act");
    h = at::relu(h);
  }
}

TEST_F(OperatorRecorderTest, RowWindowNamesThePlacementDependentOperator) {
  const at::Tensor packed = at::sin(at::arange(60, at::kFloat) * 0.53).reshape({15, 4});
  const at::Tensor alone = packed.slice(0, 5, 10).clone();
  const OperatorRecording a = Record(
      "alone", [&] { PlacementModel(recorder(), alone); }, Window({5, 0, 5}));
  const OperatorRecording b = Record(
      "packed", [&] { PlacementModel(recorder(), packed); }, Window({15, 5, 10}));
  const OperatorDivergence d = FirstOperatorDivergence(a, b);
  ASSERT_TRUE(d.first_outputs_differ.has_value()) << OperatorDivergenceJson(d).dump(1);
  EXPECT_EQ(d.first_outputs_differ->op, "aten::mean");
  EXPECT_EQ(d.first_outputs_differ->module, "center");
  EXPECT_EQ(d.first_outputs_differ->inner_op, "aten::sum");  // mean computes through sum
  EXPECT_EQ(a.records()[0].op, "aten::mul");
  EXPECT_EQ(a.records()[0].inputs_digest, b.records()[0].inputs_digest);
  EXPECT_EQ(b.records()[0].inputs[0].window_begin, 5);
  // Without the window, the packed rows differ from the first call on.
  const OperatorRecording whole = Record("whole", [&] { PlacementModel(recorder(), packed); });
  const OperatorDivergence unwindowed = FirstOperatorDivergence(a, whole);
  ASSERT_TRUE(unwindowed.first_inputs_differ.has_value());
  EXPECT_EQ(unwindowed.first_inputs_differ->index, 0);
  EXPECT_EQ(unwindowed.entered_after, -1);
}

TEST_F(OperatorRecorderTest, ADifferenceBetweenOperatorsIsSaidToEnterOutsideThem) {
  auto run = [&](float poke) {
    at::Tensor t = Values();
    OperatorRecorder::Scope scope(recorder(), "step");
    t = t * 2.0;
    t.data_ptr<float>()[3] += poke;  // outside any operator
    t = t + 1.0;
  };
  const OperatorRecording a = Record("a", [&] { run(0.0f); });
  const OperatorRecording b = Record("b", [&] { run(1.0f); });
  const OperatorDivergence d = FirstOperatorDivergence(a, b);
  EXPECT_FALSE(d.first_outputs_differ.has_value());
  ASSERT_TRUE(d.first_inputs_differ.has_value());
  EXPECT_EQ(d.first_inputs_differ->op, "aten::add");
  ASSERT_TRUE(d.entered_after.has_value());
  EXPECT_EQ(*d.entered_after, d.first_inputs_differ->index - 1);
  EXPECT_THAT(OperatorDivergenceSummary(d), HasSubstr("entered outside the operators"));
}

TEST_F(OperatorRecorderTest, AnotherOperatorSequenceIsMisaligned) {
  const OperatorRecording a = Record("a", [&] {
    OperatorRecorder::Scope scope(recorder(), "step");
    at::Tensor t = Values() * 2.0;
  });
  const OperatorRecording b = Record("b", [&] {
    OperatorRecorder::Scope scope(recorder(), "step");
    at::Tensor t = Values() * 2.0;
    t = t + 1.0;
  });
  const OperatorDivergence d = FirstOperatorDivergence(a, b);
  ASSERT_TRUE(d.misaligned_at.has_value());
  EXPECT_EQ(d.misaligned_reason, "length");
}

TEST_F(OperatorRecorderTest, OneRecorderAtATime) {
  const std::string path = dir_->path() + "/one.jsonl";
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<OperatorRecorder> first,
                                OperatorRecorder::Create(path));
  absl::StatusOr<std::unique_ptr<OperatorRecorder>> second =
      OperatorRecorder::Create(dir_->path() + "/two.jsonl");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  LOCKSTEP_EXPECT_OK(first->Close());
  OperatorRecorderOptions never_flushes;
  never_flushes.flush_every = 0;
  EXPECT_EQ(OperatorRecorder::Create(path, never_flushes).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(OperatorRecorderTest, MalformedRecordingIsRefusedNamingFileAndLine) {
  const OperatorRecording good = Record("good", [&] {
    OperatorRecorder::Scope scope(recorder(), "step");
    at::Tensor t = Values() * 2.0 + 1.0;
  });
  ASSERT_GE(good.records().size(), 2u);
  const std::string path = dir_->path() + "/bad.jsonl";
  const std::string header = R"({"lockstep.operator_recording":1,"rank":0})";
  const std::string record0 = OperatorRecordJson(good.records()[0]).dump();
  struct Case {
    std::string text;
    std::string line;
  };
  const Case cases[] = {
      {"", ":1: "},
      {"not json\n", ":1: "},
      {R"({"lockstep.operator_recording":7})"
       "\n",
       ":1: "},
      {header + "\n" + record0 + "\n{\"index\": 1}\n", ":3: "},
      {header + "\n" + record0 + "\n" + record0 + "\n", ":3: "},  // index 0 again
      {header + "\n" + record0.substr(0, record0.size() / 2) + "\n", ":2: "},
  };
  for (const Case& c : cases) {
    std::ofstream(path, std::ios::trunc) << c.text;
    absl::StatusOr<OperatorRecording> r = OperatorRecording::Load(path);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(r.status().message(), HasSubstr(path + c.line)) << c.text;
  }
  EXPECT_EQ(OperatorRecording::Load(dir_->path() + "/missing.jsonl").status().code(),
            absl::StatusCode::kNotFound);
  std::ofstream(path, std::ios::trunc) << header << "\n" << record0 << "\n";
  EXPECT_TRUE(OperatorRecording::LooksLikeOne(path));
  LOCKSTEP_EXPECT_OK(OperatorRecording::Load(path).status());
}

}  // namespace
}  // namespace numerics
}  // namespace lockstep
