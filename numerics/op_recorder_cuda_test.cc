// The operator recorder on a CUDA device (op_recorder.h): a step recorded on the GPU has the
// digests of the same step on the CPU, call for call; inputs are digested before an in-place call
// changes them; a copy to page-locked host memory (c10d's Gloo stages CUDA tensors through a
// fresh storage put under an empty tensor with set_, then copies into it without blocking) is
// digested once it has landed, and the storage's earlier contents are not taken for data; an
// output's figures (sum, max |x|) are right for every dtype; an input a call updates without its
// schema saying so, or through a nested call, is digested as it was before the call.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/detail/CUDAHooksInterface.h"
#include "absl/strings/str_cat.h"
#include "base/status_testutil.h"
#include "base/temp_dir.h"
#include "gtest/gtest.h"
#include "numerics/digest.h"
#include "numerics/op_divergence.h"
#include "numerics/op_recorder.h"
#include "numerics/op_recording.h"

namespace lockstep {
namespace numerics {
namespace {

constexpr int64_t kRows = 1024;  // large enough that a copy to the host takes a while
constexpr int64_t kColumns = 1024;

// The step on `device`; `junk` fills the staging storage before it is used, as whatever an
// allocator handed out would. The operands are float tensors, not Python-style scalars: a CPU
// TensorIterator promotes a wrapped double scalar with a recorded aten::to that CUDA (which passes
// a CPU scalar to its kernel) does not make, and the two recordings must call the same operators.
void Step(OperatorRecorder& recorder, at::Device device, uint8_t junk) {
  at::manual_seed(11);
  const at::Tensor x = at::randn({kRows, kColumns}).to(device);
  at::Tensor counts = at::ones({4}).to(device);
  const at::Tensor two = at::full({1}, 2.0, at::kFloat).to(device);
  const at::Tensor one = at::ones({1}, at::kFloat).to(device);
  at::Allocator* allocator = device.is_cuda()
                                 ? at::detail::getCUDAHooks().getPinnedMemoryAllocator()
                                 : at::getCPUAllocator();
  const int64_t bytes = kRows * kColumns * static_cast<int64_t>(sizeof(float));
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, allocator, /*resizable=*/false);
  std::memset(storage.unsafeGetStorageImpl()->data_ptr().get(), junk, static_cast<size_t>(bytes));
  OperatorRecorder::Scope scope(recorder, "step");
  const at::Tensor doubled = x * two;  // exact on every device
  counts.add_(one);
  at::Tensor staged = at::empty({0}, at::kFloat).set_(storage, 0, {kRows, kColumns}, {kColumns, 1});
  staged.copy_(doubled, /*non_blocking=*/true);
  const at::Tensor after = staged.neg();
  (void)after;
}

class OperatorRecorderCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(TempDir dir, TempDir::Make("op_recorder_cuda_test"));
    dir_ = std::make_unique<TempDir>(std::move(dir));
  }

  OperatorRecording Record(const std::string& name, at::Device device, uint8_t junk) {
    const std::string path = absl::StrCat(dir_->path(), "/", name, ".jsonl");
    absl::StatusOr<std::unique_ptr<OperatorRecorder>> recorder = OperatorRecorder::Create(path);
    EXPECT_TRUE(recorder.ok()) << recorder.status();
    if (!recorder.ok()) return OperatorRecording(0, {});
    Step(**recorder, device, junk);
    EXPECT_TRUE((*recorder)->Close().ok()) << (*recorder)->status();
    absl::StatusOr<OperatorRecording> loaded = OperatorRecording::Load(path);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? *std::move(loaded) : OperatorRecording(0, {});
  }

  std::unique_ptr<TempDir> dir_;
};

std::string Ops(const OperatorRecording& r) {
  std::string s;
  for (const OperatorRecord& record : r.records()) absl::StrAppend(&s, record.op, " ");
  return s;
}

TEST_F(OperatorRecorderCudaTest, AStepOnTheGpuHasTheDigestsOfTheSameStepOnTheCpu) {
  const OperatorRecording cpu = Record("cpu", at::Device(at::kCPU), 0x11);
  const OperatorRecording gpu = Record("gpu", at::Device(at::kCUDA, 0), 0x7f);
  ASSERT_GE(gpu.records().size(), 5u) << Ops(gpu);
  const OperatorDivergence d = FirstOperatorDivergence(cpu, gpu);
  EXPECT_FALSE(d.diverged()) << OperatorDivergenceSummary(d) << "\ncpu: " << Ops(cpu)
                             << "\ngpu: " << Ops(gpu);
  for (const OperatorRecord& r : gpu.records()) {
    // add_'s self digested before the call: the comparison with the CPU's recording, whose
    // in-place inputs op_recorder_test proves digested before the call, covers it.
    if (r.op == "aten::add_") {
      EXPECT_EQ(r.outputs[0].sum, 8.0);
    }
    if (r.op == "aten::set_") {
      ASSERT_FALSE(r.outputs.empty());
      EXPECT_EQ(r.outputs[0].kind, "uninitialized");
    }
  }
}

TEST_F(OperatorRecorderCudaTest, TwoRunsWithOtherStagingGarbageRecordIdentically) {
  const OperatorRecording a = Record("a", at::Device(at::kCUDA, 0), 0x00);
  const OperatorRecording b = Record("b", at::Device(at::kCUDA, 0), 0xff);
  const OperatorDivergence d = FirstOperatorDivergence(a, b);
  EXPECT_FALSE(d.diverged()) << OperatorDivergenceSummary(d);
}

// The digest a recorder gives the tensor `t` (any device), from its bytes on the host.
Digest128 HostDigest(const at::Tensor& t) {
  const at::Tensor bytes = t.detach().cpu().contiguous();
  return TensorBytesDigest("F32", bytes.sizes().vec(),
                           absl::string_view(static_cast<const char*>(bytes.data_ptr()),
                                             bytes.numel() * bytes.element_size()));
}

// Records `call` (of the five tensors x, weight, bias, running_mean, running_var on the GPU) and
// checks that the call `op` the program made (depth 0) has its five tensor inputs digested as they
// were before it: the running statistics are updated during the call.
void ExpectInputsDigestedBeforeTheCall(
    const std::string& path, const std::string& op,
    const std::function<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&,
                             at::Tensor&)>& call) {
  const at::Device gpu(at::kCUDA, 0);
  at::manual_seed(3);
  const at::Tensor x = (at::randn({64, 8, 32}) * 3.0 + 1.0).to(gpu);
  const at::Tensor weight = at::rand({8}).to(gpu);
  const at::Tensor bias = at::rand({8}).to(gpu);
  at::Tensor running_mean = at::rand({8}).to(gpu);
  at::Tensor running_var = at::rand({8}).to(gpu) + 1.0;
  const std::vector<Digest128> before = {HostDigest(x), HostDigest(weight), HostDigest(bias),
                                         HostDigest(running_mean), HostDigest(running_var)};
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<OperatorRecorder> recorder,
                                OperatorRecorder::Create(path));
  {
    OperatorRecorder::Scope scope(*recorder, "norm");
    call(x, weight, bias, running_mean, running_var);
  }
  LOCKSTEP_ASSERT_OK(recorder->Close());
  ASSERT_NE(HostDigest(running_mean), before[3]) << op << " did not update its running mean";
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(OperatorRecording recording, OperatorRecording::Load(path));
  const OperatorRecord* outer = nullptr;
  for (const OperatorRecord& r : recording.records()) {
    if (r.op == op && r.depth == 0) outer = &r;
  }
  ASSERT_NE(outer, nullptr) << Ops(recording);
  ASSERT_GE(outer->inputs.size(), 5u);
  std::vector<Digest128> side(outer->inputs.size());
  for (size_t i = 0; i < before.size(); ++i) {
    ASSERT_EQ(outer->inputs[i].kind, "tensor") << i;
    side[i] = before[i];
  }
  EXPECT_EQ(outer->inputs_digest, OperatorSideDigest(outer->inputs, side))
      << op << "'s inputs were not digested as they were before the call";
}

// cuDNN off (and restored), so that batch normalization runs ATen's kernels.
class CudnnOff {
 public:
  CudnnOff() : was_(at::globalContext().userEnabledCuDNN()) {
    at::globalContext().setUserEnabledCuDNN(false);
  }
  ~CudnnOff() { at::globalContext().setUserEnabledCuDNN(was_); }

 private:
  bool was_;
};

// Note [Undeclared writes]: aten::native_batch_norm's schema gives its running statistics as
// read-only, but in training its kernel updates them. aten::batch_norm (and the calls between)
// record them as they were before the update, not as the kernel left them.
TEST_F(OperatorRecorderCudaTest, RunningStatisticsABatchNormUpdatesAreDigestedBeforeIt) {
  const CudnnOff cudnn_off;
  ExpectInputsDigestedBeforeTheCall(
      absl::StrCat(dir_->path(), "/batch_norm.jsonl"), "aten::batch_norm",
      [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, at::Tensor& mean,
         at::Tensor& var) {
        (void)at::batch_norm(x, w, b, mean, var, /*training=*/true, /*momentum=*/0.5,
                             /*eps=*/1e-5, /*cudnn_enabled=*/false);
      });
}

// Note [Read-only inputs after the call]: aten::instance_norm's schema gives its running
// statistics as read-only; it updates them through a nested in-place call (aten::copy_ into an
// alias). Its recorded inputs are those before that call.
TEST_F(OperatorRecorderCudaTest, AnInputANestedCallWritesIsDigestedBeforeIt) {
  const CudnnOff cudnn_off;
  ExpectInputsDigestedBeforeTheCall(
      absl::StrCat(dir_->path(), "/instance_norm.jsonl"), "aten::instance_norm",
      [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, at::Tensor& mean,
         at::Tensor& var) {
        (void)at::instance_norm(x, w, b, mean, var, /*use_input_stats=*/true, /*momentum=*/0.5,
                                /*eps=*/1e-5, /*cudnn_enabled=*/false);
      });
}

// An output's figures on the GPU (the summary kernel, or ATen's for float8) are the double sum
// and max |x| of its elements, for every dtype, at sizes of one block, of many, and past the
// kernel's block limit (each thread then reads several times); a NaN makes both NaN.
TEST_F(OperatorRecorderCudaTest, AnOutputsFiguresOnTheGpuAreItsSumAndLargestMagnitude) {
  struct Case {
    at::ScalarType dtype;
    int64_t numel;
  };
  const Case cases[] = {{at::kFloat, 5},          {at::kFloat, 100003}, {at::kFloat, 3000017},
                        {at::kDouble, 4099},      {at::kHalf, 70001},   {at::kBFloat16, 70001},
                        {at::kLong, 9001},        {at::kInt, 9001},     {at::kShort, 901},
                        {at::kChar, 901},         {at::kByte, 901},     {at::kBool, 901},
                        {at::kFloat8_e4m3fn, 513}};
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c10::toString(c.dtype), " x ", c.numel));
    at::manual_seed(5);
    at::Tensor values = at::randn({c.numel}, at::kDouble) * 40.0;
    if (c.dtype == at::kBool) values = values.gt(0);
    const at::Tensor x = values.to(c.dtype).to(at::Device(at::kCUDA, 0));
    const at::Tensor exact = x.cpu().to(at::kDouble);
    const double want_sum = exact.sum().item<double>();
    const double want_max = exact.abs().max().item<double>();
    const std::string path = absl::StrCat(dir_->path(), "/figures.jsonl");
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<OperatorRecorder> recorder,
                                  OperatorRecorder::Create(path));
    {
      OperatorRecorder::Scope scope(*recorder, "figures");
      (void)x.clone();
    }
    LOCKSTEP_ASSERT_OK(recorder->Close());
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(OperatorRecording recording, OperatorRecording::Load(path));
    ASSERT_FALSE(recording.records().empty());
    const OperatorRecord& clone = recording.records().front();
    ASSERT_EQ(clone.op, "aten::clone");
    ASSERT_EQ(clone.outputs.size(), 1u);
    EXPECT_NEAR(clone.outputs[0].sum, want_sum, 1e-9 * std::max(1.0, std::abs(want_sum)));
    EXPECT_EQ(clone.outputs[0].max_abs, want_max);
  }
  at::Tensor with_nan = at::ones({50000}, at::kFloat);
  with_nan[31337] = std::nan("");
  const std::string path = absl::StrCat(dir_->path(), "/nan.jsonl");
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<OperatorRecorder> recorder,
                                OperatorRecorder::Create(path));
  const at::Tensor on_gpu = with_nan.to(at::Device(at::kCUDA, 0));
  {
    OperatorRecorder::Scope scope(*recorder, "nan");
    (void)on_gpu.clone();
  }
  LOCKSTEP_ASSERT_OK(recorder->Close());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(OperatorRecording recording, OperatorRecording::Load(path));
  ASSERT_FALSE(recording.records().empty());
  EXPECT_TRUE(std::isnan(recording.records().front().outputs[0].sum));
  EXPECT_TRUE(std::isnan(recording.records().front().outputs[0].max_abs));
}

}  // namespace
}  // namespace numerics
}  // namespace lockstep
