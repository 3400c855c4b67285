// admission/internal/serial_writer.h  (private to admission/)
//
// SerialWriter: one thread that runs queued writes in the order they were queued, with a sticky
// error. The ledger's queued writes and background fsyncs (ledger.h, Note [Queued ledger
// writes]) run on one.
//
// Contract:
// - Writes run one at a time, in call order, on the writer's thread (started by the first
//   Enqueue, so a failure to start it is that call's error).
// - The first write that fails (a non-OK status, or an exception it throws) is the writer's error
//   from then on: nothing queued after it runs, and every later Enqueue and AwaitIdle returns it.
// - At most `max_queued` writes wait; Enqueue beyond that waits for the writer first.
// - Destruction runs what is queued (unless a write failed), then stops the thread.
//
// Thread-safety: Enqueue, AwaitIdle and error may be called from any thread.
//
// Example:
//   SerialWriter writer("ledger a.db", 1024);
//   LOCKSTEP_RETURN_IF_ERROR(writer.Enqueue([&] { return WriteOneEvent(); }));
//   LOCKSTEP_RETURN_IF_ERROR(writer.AwaitIdle());  // written, or the sticky error

#ifndef LOCKSTEP_ADMISSION_INTERNAL_SERIAL_WRITER_H_
#define LOCKSTEP_ADMISSION_INTERNAL_SERIAL_WRITER_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"

namespace lockstep {
namespace admission {
namespace internal {

class SerialWriter {
 public:
  // `name` prefixes the errors the writer makes itself (a write that threw, a thread that did not
  // start).
  SerialWriter(std::string name, int max_queued);
  ~SerialWriter();
  SerialWriter(const SerialWriter&) = delete;
  SerialWriter& operator=(const SerialWriter&) = delete;

  // Queues `write`; the sticky error instead if there is one.
  absl::Status Enqueue(std::function<absl::Status()> write);

  // Waits until every queued write has run (or one failed); returns the sticky error (OK if none).
  absl::Status AwaitIdle();

  // The sticky error (OK if none), without waiting.
  absl::Status error() const;

 private:
  void Loop();

  const std::string name_;
  const int max_queued_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<absl::Status()>> queue_;  // guarded by mu_
  bool running_ = false;                             // guarded by mu_: a write is running
  bool stopping_ = false;                            // guarded by mu_
  absl::Status error_;                               // guarded by mu_; sticky
  std::thread thread_;
};

}  // namespace internal
}  // namespace admission
}  // namespace lockstep

#endif  // LOCKSTEP_ADMISSION_INTERNAL_SERIAL_WRITER_H_
