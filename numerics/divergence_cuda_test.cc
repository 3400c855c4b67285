// The module recorder on CUDA tensors (Note [Deferred record digests] in divergence.cc): each
// record's digest, completed when the records are read, is the digest of the tensor as it was
// when recorded, and its summary that tensor's figures.

#include <cmath>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status_testutil.h"
#include "gtest/gtest.h"
#include "numerics/digest.h"
#include "numerics/divergence.h"

namespace lockstep {
namespace numerics {
namespace {

// Near within a relative 1e-9 (float64 reductions on the device and on the host).
void ExpectNear(double device, double host, const std::string& what) {
  EXPECT_NEAR(device, host, 1e-9 * std::max(1.0, std::fabs(host))) << what;
}

TEST(DivergenceCudaTest, DeferredRecordsDigestAndSummarizeTheTensorAsRecorded) {
  at::manual_seed(0);
  const at::TensorOptions cuda = at::TensorOptions().device(at::kCUDA);
  std::vector<at::Tensor> weights;
  for (int i = 0; i < 6; ++i) weights.push_back((at::randn({64, 64}, cuda) * 0.2).requires_grad_());
  at::Tensor x = at::randn({32, 64}, cuda).requires_grad_();
  RecorderOptions options;
  options.keep_full_tensors = 1000;  // every record keeps its tensor: the reference below
  Recorder recorder(options);
  std::vector<ParameterTap> taps;
  for (int i = 0; i < 6; ++i) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(ParameterTap tap,
                                  recorder.TapParameter(absl::StrCat("w", i), weights[i]));
    taps.push_back(std::move(tap));
  }
  for (int i = 0; i < 6; ++i) {
    const std::string name = absl::StrCat("block", i);
    x = recorder.Enter(name, x);
    at::Tensor y = at::linear(x, weights[i]).tanh();
    x = recorder.Exit(name, y);
  }
  x.pow(2).sum().backward();
  for (int i = 0; i < 6; ++i) {
    LOCKSTEP_ASSERT_OK(recorder.RecordAccumulated(absl::StrCat("w", i), weights[i]));
  }
  LOCKSTEP_ASSERT_OK(recorder.status());
  const Recording recording = recorder.Snapshot();
  ASSERT_EQ(recording.records().size(), 6u * 3 + 6 * 2);
  for (const Record& r : recording.records()) {
    const std::string what = absl::StrCat(r.module, " record ", r.index);
    ASSERT_TRUE(r.tensor.defined()) << what;
    ASSERT_TRUE(r.tensor.is_cpu()) << what;
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(const Digest128 host, DigestTensor(r.tensor));
    EXPECT_EQ(DigestHex128(r.digest), DigestHex128(host)) << what;
    const at::Tensor d = r.tensor.to(at::kDouble);
    ExpectNear(r.summary.sum, d.sum().item<double>(), what + " sum");
    ExpectNear(r.summary.mean_abs, d.abs().mean().item<double>(), what + " mean |x|");
    ExpectNear(r.summary.min, d.min().item<double>(), what + " min");
    ExpectNear(r.summary.max, d.max().item<double>(), what + " max");
    ExpectNear(r.summary.l2, d.norm().item<double>(), what + " L2");
  }
}

}  // namespace
}  // namespace numerics
}  // namespace lockstep
