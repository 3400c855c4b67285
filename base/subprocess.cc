#include "base/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/posix_io.h"

namespace lockstep {
namespace {

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// In the child, right after fork: die with the parent, take a group of its own if asked.
void SetUpChild(const ChildOptions& options, pid_t parent) {
  if (options.die_with_parent) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    // The parent may have died between fork and prctl: then nobody would signal us.
    if (getppid() != parent) _exit(137);
  }
  if (options.own_process_group) setpgid(0, 0);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
}

// Forks with a pipe; runs `in_child(write_end)` in the child, which never returns.
absl::StatusOr<std::pair<pid_t, int>> ForkWithPipe(const ChildOptions& options,
                                                   const std::function<void(int)>& in_child) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return Errno("pipe");
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const absl::Status error = Errno("fork");
    close(fds[0]);
    close(fds[1]);
    return error;
  }
  if (pid == 0) {
    close(fds[0]);
    SetUpChild(options, parent);
    in_child(fds[1]);
    _exit(127);  // in_child does not return
  }
  close(fds[1]);
  // Also here, so the group exists before the parent might signal it.
  if (options.own_process_group) setpgid(pid, pid);
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  return std::make_pair(pid, fds[0]);
}

}  // namespace

absl::StatusOr<Child> Child::Fork(const ChildOptions& options,
                                  const std::function<int(int channel_fd)>& body) {
  auto forked = ForkWithPipe(options, [&](int channel) {
    if (options.channel_is_output) {
      dup2(channel, STDOUT_FILENO);
      dup2(channel, STDERR_FILENO);
    } else {
      // The report descriptor stays open in the body (pipe2 set close-on-exec only).
    }
    const int code = body(channel);
    close(channel);
    _exit(code);
  });
  if (!forked.ok()) return forked.status();
  return Child(forked->first, forked->second, options.own_process_group);
}

absl::StatusOr<Child> Child::Exec(
    const ChildOptions& options, const std::vector<std::string>& argv,
    const std::vector<std::pair<std::string, std::string>>& environment) {
  if (argv.empty()) return absl::InvalidArgumentError("no program given");
  auto forked = ForkWithPipe(options, [&](int channel) {
    if (options.channel_is_output) {
      dup2(channel, STDOUT_FILENO);  // dup2 clears close-on-exec on the copies
      dup2(channel, STDERR_FILENO);
    }
    for (const auto& [name, value] : environment) setenv(name.c_str(), value.c_str(), 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    WriteAll(STDERR_FILENO, absl::StrCat("cannot run ", argv[0], ": ", std::strerror(errno), "\n"));
    _exit(127);
  });
  if (!forked.ok()) return forked.status();
  return Child(forked->first, forked->second, options.own_process_group);
}

Child::Child(Child&& other) noexcept
    : pid_(other.pid_),
      channel_(other.channel_),
      own_group_(other.own_group_),
      exited_(other.exited_),
      wait_status_(other.wait_status_) {
  other.pid_ = -1;
  other.channel_ = -1;
}

Child& Child::operator=(Child&& other) noexcept {
  if (this != &other) {
    this->~Child();
    new (this) Child(std::move(other));
  }
  return *this;
}

Child::~Child() {
  CloseChannel();
  if (pid_ > 0 && !exited_) {
    Signal(SIGKILL);
    Reap();
  }
}

void Child::CloseChannel() {
  if (channel_ >= 0) close(channel_);
  channel_ = -1;
}

void Child::Signal(int signal) const {
  if (pid_ <= 0 || exited_) return;
  if (own_group_) {
    kill(-pid_, signal);
  } else {
    kill(pid_, signal);
  }
}

bool Child::TryReap() {
  if (exited_ || pid_ <= 0) return exited_;
  pid_t done;
  do {
    done = waitpid(pid_, &wait_status_, WNOHANG);
  } while (done < 0 && errno == EINTR);
  if (done == pid_) exited_ = true;
  return exited_;
}

void Child::Reap() {
  if (exited_ || pid_ <= 0) return;
  pid_t done;
  do {
    done = waitpid(pid_, &wait_status_, 0);
  } while (done < 0 && errno == EINTR);
  exited_ = true;
}

bool Child::succeeded() const {
  return exited_ && WIFEXITED(wait_status_) && WEXITSTATUS(wait_status_) == 0;
}

int Child::ExitCode() const {
  if (WIFSIGNALED(wait_status_)) return 128 + WTERMSIG(wait_status_);
  return WEXITSTATUS(wait_status_);
}

std::string Child::Describe() const {
  if (!exited_) return "is still running";
  if (WIFSIGNALED(wait_status_)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(wait_status_), " (",
                        strsignal(WTERMSIG(wait_status_)), ")");
  }
  return absl::StrCat("exited with code ", WEXITSTATUS(wait_status_));
}

absl::StatusOr<int> PollChannels(absl::Span<Child* const> children, absl::Duration timeout,
                                 const std::function<void(size_t, absl::string_view)>& on_data) {
  std::vector<pollfd> polled;
  std::vector<size_t> owner;
  for (size_t i = 0; i < children.size(); ++i) {
    if (children[i]->channel() < 0) continue;
    polled.push_back({children[i]->channel(), POLLIN, 0});
    owner.push_back(i);
  }
  if (polled.empty()) return 0;
  const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout));
  int ready;
  do {
    ready = poll(polled.data(), polled.size(), static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
  } while (ready < 0 && errno == EINTR);
  if (ready < 0) return Errno("poll");
  int open = static_cast<int>(polled.size());
  for (size_t i = 0; ready > 0 && i < polled.size(); ++i) {
    if (polled[i].revents == 0) continue;
    Child& child = *children[owner[i]];
    char buffer[65536];
    ssize_t got;
    do {
      got = read(child.channel(), buffer, sizeof(buffer));
    } while (got < 0 && errno == EINTR);
    if (got < 0 && errno == EAGAIN) continue;
    if (got > 0) {
      on_data(owner[i], absl::string_view(buffer, static_cast<size_t>(got)));
      continue;
    }
    on_data(owner[i], absl::string_view());
    child.CloseChannel();
    --open;
  }
  return open;
}

}  // namespace lockstep
