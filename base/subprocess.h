// base/subprocess.h
//
// Child processes, written once for every lockstep program that runs others: tools/launch's
// ranks, the forked worlds of the collectives tests and benchmarks, qualify's workers. A Child
// is a forked (and optionally exec'd) process with one pipe to the parent, its channel: either
// the child's stdout and stderr (programs run by Exec) or a descriptor its body writes reports
// to (bodies run by Fork). PollChannels waits on many channels at once with a bound, and a Child
// reaps, signals and describes its process.
//
// Children die with their parent by default (PR_SET_PDEATHSIG SIGKILL, set before the body or
// the program starts), so a killed launcher never leaves ranks behind. A Child destroyed while
// its process still runs kills (SIGKILL) and reaps it: nothing outlives its owner.
//
// Precondition for Fork: the body runs in a copy of the calling process with only the calling
// thread; it must not rely on other threads (LibTorch's intra-op pools, for example, must be
// started inside the body, not before the fork).
//
// Thread-safety: a Child is used by one thread at a time.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(Child child, Child::Exec(ChildOptions::Output(), {"ls", "/"}, {}));
//   std::string output;
//   while (PollChannels({&child}, absl::Seconds(5),
//                       [&](size_t, absl::string_view bytes) { output.append(bytes); }) > 0) {
//   }
//   child.Reap();
//   if (!child.succeeded()) return absl::InternalError("ls " + child.Describe());

#ifndef LOCKSTEP_BASE_SUBPROCESS_H_
#define LOCKSTEP_BASE_SUBPROCESS_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace lockstep {

// How Child::Fork and Child::Exec start a child: what its channel carries, and its process group
// and parent-death settings.
struct ChildOptions {
  // A child whose body reports through its channel descriptor; stdout/stderr are inherited.
  static ChildOptions Reporting() { return ChildOptions(); }
  // A child whose stdout and stderr are its channel.
  static ChildOptions Output() {
    ChildOptions options;
    options.channel_is_output = true;
    return options;
  }

  // Whether the channel carries the child's stdout and stderr (Output) rather than what its
  // body writes to the channel descriptor (Reporting). Default: false.
  bool channel_is_output = false;
  // Puts the child in a process group of its own, so that Signal reaches whatever it starts.
  // Default: false.
  bool own_process_group = false;
  // Kills the child (SIGKILL) when this process dies. Default: true.
  bool die_with_parent = true;
};

// A child process started by Fork or Exec, with its channel; kills and reaps the process when
// destroyed while it runs (see the top of this file).
class Child {
 public:
  // Forks a child that runs body(channel_fd) and exits with its return value (skipping the
  // parent's atexit handlers and static destructors). kInternal when pipe or fork fails.
  static absl::StatusOr<Child> Fork(const ChildOptions& options,
                                    const std::function<int(int channel_fd)>& body);

  // Forks and runs `argv` (argv[0] looked up on PATH) with `environment` added to this
  // process's. A program that cannot be started exits 127 after writing why to its stderr.
  static absl::StatusOr<Child> Exec(
      const ChildOptions& options, const std::vector<std::string>& argv,
      const std::vector<std::pair<std::string, std::string>>& environment);

  // Takes over `other`'s process and channel; `other` then owns neither.
  Child(Child&& other) noexcept;
  // Ends this child as the destructor does (closes its channel; kills and reaps a running
  // process), then takes over `other`'s process and channel.
  Child& operator=(Child&& other) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child();

  // The child's process id (-1 once moved from).
  pid_t pid() const { return pid_; }
  // The read end of the child's channel (non-blocking), or -1 once it is closed.
  int channel() const { return channel_; }
  // Closes the read end of the channel (a no-op once closed); the child then gets SIGPIPE or
  // EPIPE if it writes to it.
  void CloseChannel();

  // Sends `signal` to the child (to its process group when it has one) unless it was reaped.
  void Signal(int signal) const;

  // Reaps the child if it has exited; returns whether it has.
  bool TryReap();
  // Waits for the child to exit and reaps it.
  void Reap();
  // Whether the child has been reaped (TryReap returned true, or Reap returned).
  bool exited() const { return exited_; }
  // Precondition for the three below: exited().
  bool succeeded() const;
  // The exit code, or 128 + the signal that killed it (the shell's convention).
  int ExitCode() const;
  // "exited with code 3", "was killed by signal 9 (Killed)".
  std::string Describe() const;

 private:
  Child(pid_t pid, int channel, bool own_group)
      : pid_(pid), channel_(channel), own_group_(own_group) {}

  pid_t pid_ = -1;
  int channel_ = -1;
  bool own_group_ = false;
  bool exited_ = false;
  int wait_status_ = 0;
};

// Waits up to `timeout` for any open channel among `children` to hold data or reach its end,
// then reads every ready channel once: on_data(index, bytes) gets what was read, and at the end
// of a stream on_data(index, "") is called and the channel closed. Returns how many channels are
// still open (0: every child closed its channel). Retries on EINTR; a poll that fails otherwise
// is kInternal.
absl::StatusOr<int> PollChannels(absl::Span<Child* const> children, absl::Duration timeout,
                                 const std::function<void(size_t, absl::string_view)>& on_data);

}  // namespace lockstep

#endif  // LOCKSTEP_BASE_SUBPROCESS_H_
