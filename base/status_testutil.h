// base/status_testutil.h  (testonly)
//
// GoogleTest helpers for absl::Status and absl::StatusOr that fail the test, printing the
// status, instead of crashing on a dereference of an error:
//   LOCKSTEP_EXPECT_OK(expr);                      // expr: Status or StatusOr
//   LOCKSTEP_ASSERT_OK(expr);
//   LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto value, expr);  // ends the test on error

#ifndef LOCKSTEP_BASE_STATUS_TESTUTIL_H_
#define LOCKSTEP_BASE_STATUS_TESTUTIL_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace testing_internal {

inline const absl::Status& AsStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& AsStatus(const absl::StatusOr<T>& value) {
  return value.status();
}

}  // namespace testing_internal
}  // namespace lockstep

#define LOCKSTEP_EXPECT_OK(expr)                                                  \
  do {                                                                            \
    const auto& lockstep_expect_ok_ = (expr);                                     \
    EXPECT_TRUE(::lockstep::testing_internal::AsStatus(lockstep_expect_ok_).ok()) \
        << ::lockstep::testing_internal::AsStatus(lockstep_expect_ok_);           \
  } while (0)

#define LOCKSTEP_ASSERT_OK(expr)                                                  \
  do {                                                                            \
    const auto& lockstep_assert_ok_ = (expr);                                     \
    ASSERT_TRUE(::lockstep::testing_internal::AsStatus(lockstep_assert_ok_).ok()) \
        << ::lockstep::testing_internal::AsStatus(lockstep_assert_ok_);           \
  } while (0)

#define LOCKSTEP_TESTUTIL_CONCAT_INNER_(a, b) a##b
#define LOCKSTEP_TESTUTIL_CONCAT_(a, b) LOCKSTEP_TESTUTIL_CONCAT_INNER_(a, b)

#define LOCKSTEP_ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  LOCKSTEP_ASSERT_OK_AND_ASSIGN_IMPL_(            \
      LOCKSTEP_TESTUTIL_CONCAT_(lockstep_assert_statusor_, __LINE__), lhs, rexpr)

#define LOCKSTEP_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                        \
  ASSERT_TRUE(statusor.ok()) << statusor.status();                \
  lhs = std::move(statusor).value()

#endif  // LOCKSTEP_BASE_STATUS_TESTUTIL_H_
