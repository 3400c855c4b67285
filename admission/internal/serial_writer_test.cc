#include "admission/internal/serial_writer.h"

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace admission {
namespace internal {
namespace {

using ::testing::HasSubstr;

TEST(SerialWriterTest, WritesRunInOrderOnOneOtherThread) {
  std::vector<int> order;
  std::thread::id caller = std::this_thread::get_id(), writer_thread;
  {
    SerialWriter writer("w", 4);
    for (int i = 0; i < 100; ++i) {
      LOCKSTEP_ASSERT_OK(writer.Enqueue([&, i] {
        order.push_back(i);
        writer_thread = std::this_thread::get_id();
        return absl::OkStatus();
      }));
    }
    LOCKSTEP_ASSERT_OK(writer.AwaitIdle());
    ASSERT_EQ(order.size(), 100u);
  }
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  EXPECT_NE(writer_thread, caller);
}

// A failed write is sticky: nothing queued after it runs, and every later call returns it.
TEST(SerialWriterTest, AFailedWriteStopsEveryLaterWriteAndIsEveryLaterCallsError) {
  SerialWriter writer("w", 1024);
  std::atomic<int> ran{0};
  LOCKSTEP_ASSERT_OK(writer.Enqueue([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the rest queue behind it
    return absl::DataLossError("disk full");
  }));
  for (int i = 0; i < 50; ++i) {
    writer
        .Enqueue([&] {
          ++ran;
          return absl::OkStatus();
        })
        .IgnoreError();
  }
  EXPECT_EQ(writer.AwaitIdle().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ran.load(), 0) << "writes after the failed one ran";
  EXPECT_EQ(writer.error().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(writer.Enqueue([] { return absl::OkStatus(); }).code(), absl::StatusCode::kDataLoss);
}

TEST(SerialWriterTest, AWriteThatThrowsBecomesTheStickyError) {
  SerialWriter writer("ledger x.db", 8);
  LOCKSTEP_ASSERT_OK(writer.Enqueue([]() -> absl::Status { throw std::runtime_error("boom"); }));
  const absl::Status s = writer.AwaitIdle();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("ledger x.db: a queued write threw: boom"));
}

// Destruction runs what is still queued.
TEST(SerialWriterTest, DestructionRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    SerialWriter writer("w", 1024);
    for (int i = 0; i < 20; ++i) {
      LOCKSTEP_ASSERT_OK(writer.Enqueue([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ++ran;
        return absl::OkStatus();
      }));
    }
  }
  EXPECT_EQ(ran.load(), 20);
}

// At most max_queued writes wait: the caller waits for the writer beyond that.
TEST(SerialWriterTest, TheQueueIsBounded) {
  SerialWriter writer("w", 2);
  std::atomic<bool> release{false};
  std::atomic<int> queued{0};
  LOCKSTEP_ASSERT_OK(writer.Enqueue([&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return absl::OkStatus();
  }));
  std::thread caller([&] {
    for (int i = 0; i < 4; ++i) {
      writer.Enqueue([] { return absl::OkStatus(); }).IgnoreError();
      ++queued;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_LE(queued.load(), 2) << "more writes queued than the bound lets wait";
  release = true;
  caller.join();
  LOCKSTEP_EXPECT_OK(writer.AwaitIdle());
  EXPECT_EQ(queued.load(), 4);
}

}  // namespace
}  // namespace internal
}  // namespace admission
}  // namespace lockstep
