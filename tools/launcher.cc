#include "tools/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/posix_io.h"

namespace lockstep {
namespace tools {
namespace {

volatile sig_atomic_t g_stop_signal = 0;

void OnStopSignal(int signal) { g_stop_signal = signal; }

struct Rank {
  pid_t pid = -1;
  int fd = -1;
  std::string pending;  // output after the last newline
  bool exited = false;
  int wait_status = 0;
};

void SignalAll(std::vector<Rank>& ranks, int signal) {
  for (Rank& r : ranks) {
    if (!r.exited) kill(-r.pid, signal);  // the rank's whole process group
  }
}

std::string Describe(int rank, int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    return absl::StrCat("rank ", rank, " was killed by signal ", WTERMSIG(wait_status), " (",
                        strsignal(WTERMSIG(wait_status)), ")");
  }
  return absl::StrCat("rank ", rank, " exited with code ", WEXITSTATUS(wait_status));
}

// Moves the complete lines of `pending` (all of it at end of stream) into the returned text,
// each prefixed with the rank.
std::string TakeLines(int rank, std::string* pending, bool end_of_stream) {
  std::string out;
  size_t start = 0;
  for (size_t nl = pending->find('\n'); nl != std::string::npos; nl = pending->find('\n', start)) {
    absl::StrAppend(&out, "[rank ", rank, "] ",
                    absl::string_view(*pending).substr(start, nl + 1 - start));
    start = nl + 1;
  }
  if (end_of_stream && start < pending->size()) {
    absl::StrAppend(&out, "[rank ", rank, "] ", absl::string_view(*pending).substr(start), "\n");
    start = pending->size();
  }
  pending->erase(0, start);
  return out;
}

int ExitCodeOf(int wait_status) {
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return WEXITSTATUS(wait_status);
}

}  // namespace

absl::StatusOr<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args) {
  LaunchOptions options;
  size_t i = 0;
  auto value_of = [&](const std::string& flag) -> absl::StatusOr<std::string> {
    if (i + 1 >= args.size()) return absl::InvalidArgumentError(flag + " needs a value");
    return args[++i];
  };
  auto int_in = [](const std::string& flag, const std::string& text, int lo,
                   int hi) -> absl::StatusOr<int> {
    int v = 0;
    if (!absl::SimpleAtoi(text, &v) || v < lo || v > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " ", text, " is not an integer in [", lo, ", ", hi, "]"));
    }
    return v;
  };
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.rfind("--", 0) != 0) break;  // the program starts here
    absl::StatusOr<std::string> v = value_of(a);
    if (!v.ok()) return v.status();
    if (a == "--nproc") {
      auto n = int_in(a, *v, 1, 1024);
      if (!n.ok()) return n.status();
      options.nproc = *n;
    } else if (a == "--master_addr") {
      options.master_addr = *v;
    } else if (a == "--master_port") {
      auto p = int_in(a, *v, 0, 65535);
      if (!p.ok()) return p.status();
      options.master_port = *p;
    } else if (a == "--grace_seconds") {
      auto g = int_in(a, *v, 0, 3600);
      if (!g.ok()) return g.status();
      options.grace = absl::Seconds(*g);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag ", a,
                       "; usage: launch [--nproc N] [--master_addr A] [--master_port P] "
                       "[--grace_seconds S] [--] PROGRAM [ARGS...]"));
    }
  }
  options.command.assign(args.begin() + std::min(i, args.size()), args.end());
  if (options.command.empty()) {
    return absl::InvalidArgumentError("no program given; usage: launch [--nproc N] -- PROGRAM");
  }
  return options;
}

absl::StatusOr<LaunchResult> Launch(const LaunchOptions& options) {
  if (options.nproc < 1) {
    return absl::InvalidArgumentError(absl::StrCat("nproc ", options.nproc, " must be >= 1"));
  }
  if (options.command.empty()) return absl::InvalidArgumentError("no program given");
  int port = options.master_port;
  if (port == 0) {
    absl::StatusOr<int> free_port = FreeLoopbackPort();
    if (!free_port.ok()) return free_port.status();
    port = *free_port;
  }

  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  struct sigaction old_int {
  }, old_term{};
  g_stop_signal = 0;
  sigaction(SIGINT, &action, &old_int);
  sigaction(SIGTERM, &action, &old_term);

  std::vector<Rank> ranks(options.nproc);
  for (int r = 0; r < options.nproc; ++r) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      SignalAll(ranks, SIGKILL);
      return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
    }
    const pid_t pid = fork();
    if (pid < 0) {
      SignalAll(ranks, SIGKILL);
      return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
    }
    if (pid == 0) {
      setpgid(0, 0);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
      setenv("MASTER_ADDR", options.master_addr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(options.nproc).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(options.nproc).c_str(), 1);
      std::vector<char*> argv;
      for (const std::string& a : options.command) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      const std::string error =
          absl::StrCat("launch: cannot run ", options.command[0], ": ", std::strerror(errno), "\n");
      WriteAll(STDERR_FILENO, error);
      _exit(127);
    }
    setpgid(pid, pid);  // also here, so the group exists before we might signal it
    close(fds[1]);
    ranks[r].pid = pid;
    ranks[r].fd = fds[0];
    // Non-blocking, so the final drain cannot wait on a grandchild that kept the pipe open.
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  }

  LaunchResult result;
  absl::Time kill_at = absl::InfiniteFuture();
  auto stop_others = [&](const std::string& why) {
    if (kill_at != absl::InfiniteFuture()) return;
    WriteAll(options.output_fd, absl::StrCat("[launch] ", why, "; stopping the other ranks\n"));
    SignalAll(ranks, SIGTERM);
    kill_at = absl::Now() + options.grace;
  };

  int running = options.nproc;
  while (running > 0) {
    if (g_stop_signal != 0 && result.failed_rank < 0 && kill_at == absl::InfiniteFuture()) {
      result.exit_code = 128 + g_stop_signal;
      result.summary = absl::StrCat("launcher received signal ", static_cast<int>(g_stop_signal));
      stop_others(result.summary);
    }
    if (absl::Now() >= kill_at) SignalAll(ranks, SIGKILL);

    std::vector<pollfd> polled;
    std::vector<int> owner;
    for (int r = 0; r < options.nproc; ++r) {
      if (ranks[r].fd < 0) continue;
      polled.push_back({ranks[r].fd, POLLIN, 0});
      owner.push_back(r);
    }
    int wait_ms = 100;  // also the period at which exits are reaped
    if (!polled.empty()) {
      const int ready = poll(polled.data(), polled.size(), wait_ms);
      if (ready < 0 && errno != EINTR) {
        SignalAll(ranks, SIGKILL);
        return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
      }
      for (size_t i = 0; ready > 0 && i < polled.size(); ++i) {
        if (polled[i].revents == 0) continue;
        Rank& rank = ranks[owner[i]];
        char buffer[65536];
        const ssize_t got = read(rank.fd, buffer, sizeof(buffer));
        if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (got > 0) {
          rank.pending.append(buffer, static_cast<size_t>(got));
        }
        WriteAll(options.output_fd, TakeLines(owner[i], &rank.pending, got <= 0));
        if (got <= 0) {
          close(rank.fd);
          rank.fd = -1;
        }
      }
    } else {
      usleep(wait_ms * 1000);
    }

    for (int r = 0; r < options.nproc; ++r) {
      Rank& rank = ranks[r];
      if (rank.exited) continue;
      const pid_t done = waitpid(rank.pid, &rank.wait_status, WNOHANG);
      if (done != rank.pid) continue;
      rank.exited = true;
      --running;
      const bool failed = !(WIFEXITED(rank.wait_status) && WEXITSTATUS(rank.wait_status) == 0);
      if (failed && result.failed_rank < 0 && result.exit_code == 0) {
        result.failed_rank = r;
        result.exit_code = ExitCodeOf(rank.wait_status);
        result.summary = Describe(r, rank.wait_status);
        stop_others(result.summary);
      }
    }
  }
  // Drain what the ranks wrote just before exiting.
  for (int r = 0; r < options.nproc; ++r) {
    Rank& rank = ranks[r];
    if (rank.fd < 0) continue;
    char buffer[65536];
    ssize_t got;
    while ((got = read(rank.fd, buffer, sizeof(buffer))) > 0) rank.pending.append(buffer, got);
    WriteAll(options.output_fd, TakeLines(r, &rank.pending, /*end_of_stream=*/true));
    close(rank.fd);
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  if (result.summary.empty()) {
    result.summary = absl::StrCat("all ", options.nproc, " ranks exited with code 0");
  }
  return result;
}

}  // namespace tools
}  // namespace lockstep
