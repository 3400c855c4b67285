// base/logging: messages reach glog's stderr sink with their severity, VLOG follows glog's
// verbosity, CHECK aborts with the condition and the streamed text.

#include "base/logging.h"

#include <string>

#include "gflags/gflags.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(LoggingTest, MessagesReachStderrWithTheirSeverity) {
  FLAGS_logtostderr = true;
  ::testing::internal::CaptureStderr();
  LOCKSTEP_LOG(WARNING) << "rank " << 3 << " is late";
  LOCKSTEP_LOG(ERROR) << "rank 5 is gone";
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("rank 3 is late"));
  EXPECT_THAT(err, HasSubstr("rank 5 is gone"));
  EXPECT_THAT(err, HasSubstr("logging_test.cc"));  // glog's prefix names the call site
}

TEST(LoggingTest, VlogFollowsGlogVerbosity) {
  FLAGS_logtostderr = true;
  FLAGS_v = 0;
  int evaluated = 0;
  ::testing::internal::CaptureStderr();
  LOCKSTEP_VLOG(1) << "hidden progress " << ++evaluated;
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, Not(HasSubstr("hidden progress")));
  EXPECT_EQ(evaluated, 0) << "a disabled VLOG must not evaluate its arguments";
  FLAGS_v = 2;
  ::testing::internal::CaptureStderr();
  LOCKSTEP_VLOG(2) << "shown diagnostics";
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("shown diagnostics"));
  FLAGS_v = 0;
}

TEST(LoggingDeathTest, CheckAbortsNamingTheConditionAndText) {
  const int offset = 7;
  EXPECT_DEATH(LOCKSTEP_CHECK(offset < 5) << "offset " << offset << " past 5",
               "Check failed: offset < 5 offset 7 past 5");
  LOCKSTEP_CHECK(offset == 7) << "never printed";
}

TEST(LoggingTest, InitLoggingIsIdempotent) {
  InitLogging("logging_test");
  InitLogging("logging_test");
  EXPECT_TRUE(google::IsGoogleLoggingInitialized());
}

}  // namespace
}  // namespace lockstep
