#include "base/torch_boundary.h"

#include <stdexcept>
#include <vector>

#include "absl/status/status.h"
#include "base/status_macros.h"
#include "c10/util/Exception.h"
#include "gloo/common/error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "torch/version.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;

TEST(CallTorchTest, OutOfMemoryBecomesResourceExhaustedWithContext) {
  absl::Status status = CallTorch("while admitting microbatch 3", [] {
    throw c10::OutOfMemoryError({__func__, __FILE__, __LINE__}, "CUDA out of memory");
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("while admitting microbatch 3"));
  EXPECT_THAT(status.message(), HasSubstr("CUDA out of memory"));
}

TEST(CallTorchTest, BadAllocBecomesResourceExhausted) {
  absl::Status status = CallTorch("alloc", [] { throw std::bad_alloc(); });
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
}

TEST(CallTorchTest, ValueErrorBecomesInvalidArgument) {
  absl::Status status = CallTorch("ctx", [] {
    throw c10::ValueError({__func__, __FILE__, __LINE__}, "shape mismatch");
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("shape mismatch"));
}

TEST(CallTorchTest, IndexAndTypeErrorsBecomeInvalidArgument) {
  absl::Status index = CallTorch("indexing", [] {
    throw c10::IndexError({__func__, __FILE__, __LINE__}, "index 9 is out of bounds");
  });
  EXPECT_EQ(index.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(index.message(), "indexing: index 9 is out of bounds");
  absl::Status type = CallTorch("typing", [] {
    throw c10::TypeError({__func__, __FILE__, __LINE__}, "expected a float tensor");
  });
  EXPECT_EQ(type.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(type.message(), "typing: expected a float tensor");
}

TEST(CallTorchTest, NotImplementedErrorBecomesUnimplemented) {
  absl::Status status = CallTorch("op", [] {
    throw c10::NotImplementedError({__func__, __FILE__, __LINE__}, "no kernel for this backend");
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(status.message(), "op: no kernel for this backend");
}

TEST(CallTorchTest, GlooTransportErrorsBecomeUnavailable) {
  absl::Status io = CallTorch("broadcast on gloo group [0, 1]", [] {
    throw gloo::IoException("Connection closed by peer [127.0.0.1]:4242");
  });
  EXPECT_EQ(io.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(io.message(),
            "broadcast on gloo group [0, 1]: Connection closed by peer [127.0.0.1]:4242");
  // The code comes from the type, not the words: a message that mentions a timeout does not
  // make a plain runtime error a deadline.
  absl::Status words = CallTorch("ctx", [] { throw std::runtime_error("Socket Timeout"); });
  EXPECT_EQ(words.code(), absl::StatusCode::kInternal);
}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
TEST(CallTorchTest, C10dDistErrorsBecomeUnavailable) {
  absl::Status network = CallTorch("all-gather on group [0, 1]", [] {
    C10_THROW_ERROR(DistNetworkError, "Connection reset by peer");
  });
  EXPECT_EQ(network.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(network.message(), "all-gather on group [0, 1]: Connection reset by peer");
  absl::Status store = CallTorch("ctx", [] { C10_THROW_ERROR(DistStoreError, "key missing"); });
  EXPECT_EQ(store.code(), absl::StatusCode::kUnavailable);
  absl::Status backend = CallTorch("ctx", [] { C10_THROW_ERROR(DistBackendError, "aborted"); });
  EXPECT_EQ(backend.code(), absl::StatusCode::kUnavailable);
}
#endif

// ThrowAsTorchError is CallTorch's inverse: every code it distinguishes survives the round trip.
TEST(ThrowAsTorchErrorTest, RoundTripsThroughCallTorch) {
  for (absl::StatusCode code :
       {absl::StatusCode::kResourceExhausted, absl::StatusCode::kInvalidArgument,
        absl::StatusCode::kUnimplemented, absl::StatusCode::kUnavailable,
        absl::StatusCode::kInternal}) {
    const absl::Status original(code, "what went wrong");
    const absl::Status back = CallTorch("in backward", [&] { ThrowAsTorchError(original); });
    EXPECT_EQ(back.code(), code) << original;
    EXPECT_EQ(back.message(), "in backward: what went wrong");
  }
  // Codes without an exception type of their own come back as kInternal, message intact.
  const absl::Status deadline = CallTorch(
      "", [] { ThrowAsTorchError(absl::DeadlineExceededError("a peer did not arrive")); });
  EXPECT_EQ(deadline.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(deadline.message(), "a peer did not arrive");
}

TEST(CallTorchTest, MessagesKeepOnlyTheFirstLine) {
  absl::Status status = CallTorch("ctx", [] {
    throw std::runtime_error("what failed\nframe #0: somewhere\nframe #1: elsewhere");
  });
  EXPECT_EQ(status.message(), "ctx: what failed");
}

TEST(CallTorchTest, OtherErrorsBecomeInternal) {
  EXPECT_EQ(CallTorch("ctx", [] { throw std::runtime_error("boom"); }).code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(CallTorch("ctx", [] { throw 42; }).code(), absl::StatusCode::kInternal);
}

TEST(CallTorchTest, PassesValuesAndStatusesThrough) {
  EXPECT_TRUE(CallTorch("ctx", [] {}).ok());
  absl::StatusOr<int> value = CallTorch("ctx", [] { return absl::StatusOr<int>(7); });
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(*value, 7);
  absl::Status inner = CallTorch("ctx", [] { return absl::NotFoundError("missing"); });
  EXPECT_EQ(inner.code(), absl::StatusCode::kNotFound);
}

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError(absl::StrCat(x, " is odd"));
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  LOCKSTEP_ASSIGN_OR_RETURN(int half, Half(x));
  LOCKSTEP_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

absl::Status CheckQuarter(int x) {
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(Quarter(x).status(), absl::StrCat("while quartering ", x));
  return absl::OkStatus();
}

TEST(StatusMacrosTest, ContextReadsFromTheInnermostOperationOutwards) {
  // Note [Context order] in torch_boundary.h.
  absl::Status inner = CallTorch("allocating the output", [] {
    throw c10::OutOfMemoryError({__func__, __FILE__, __LINE__}, "tried to allocate 2 GiB");
  });
  absl::Status outer = Annotate(Annotate(inner, "while gathering outputs"), "in microbatch 3");
  EXPECT_EQ(outer.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(outer.message(),
            "allocating the output: tried to allocate 2 GiB; while gathering outputs; in "
            "microbatch 3");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "ignored").ok());
}

TEST(StatusMacrosTest, AssignOrReturnPropagatesTheFirstError) {
  const absl::StatusOr<int> quarter = Quarter(12);
  ASSERT_TRUE(quarter.ok()) << quarter.status();
  EXPECT_EQ(*quarter, 3);
  EXPECT_EQ(Quarter(6).status().message(), "3 is odd");
  absl::Status status = CheckQuarter(6);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "3 is odd; while quartering 6");
  EXPECT_TRUE(CheckQuarter(8).ok());
}

}  // namespace
}  // namespace lockstep
