#include "admission/internal/serial_writer.h"

#include <exception>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace admission {
namespace internal {

SerialWriter::SerialWriter(std::string name, int max_queued)
    : name_(std::move(name)), max_queued_(max_queued) {}

SerialWriter::~SerialWriter() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void SerialWriter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) return;  // stopping, nothing pending
    std::function<absl::Status()> write = std::move(queue_.front());
    queue_.pop_front();
    if (!error_.ok()) {  // nothing after a failed write runs
      cv_.notify_all();
      continue;
    }
    running_ = true;
    lock.unlock();
    absl::Status written;
    try {
      written = write();
    } catch (const std::exception& e) {
      written = absl::InternalError(absl::StrCat(name_, ": a queued write threw: ", e.what()));
    }
    lock.lock();
    running_ = false;
    if (!written.ok()) error_ = written;
    cv_.notify_all();
  }
}

absl::Status SerialWriter::Enqueue(std::function<absl::Status()> write) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return static_cast<int>(queue_.size()) < max_queued_ || !error_.ok(); });
  if (!error_.ok()) return error_;
  if (!thread_.joinable()) {
    try {
      thread_ = std::thread([this] { Loop(); });
    } catch (const std::system_error& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat(name_, ": starting its writer thread: ", e.what()));
    }
  }
  queue_.push_back(std::move(write));
  lock.unlock();
  cv_.notify_all();
  return absl::OkStatus();
}

absl::Status SerialWriter::AwaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  // After a failure the writer may still be dropping what was queued after it; none of that
  // runs, so the writer is settled.
  cv_.wait(lock, [&] { return (queue_.empty() && !running_) || !error_.ok(); });
  return error_;
}

absl::Status SerialWriter::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

}  // namespace internal
}  // namespace admission
}  // namespace lockstep
