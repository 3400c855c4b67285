#include "testing/process_world.h"

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "ATen/Parallel.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/posix_io.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "collectives/gloo_communicator.h"
#include "collectives/rendezvous.h"

namespace lockstep {
namespace testing {
namespace {

// A report is the status code (4 bytes, little endian) followed by the message.
std::string EncodeStatus(const absl::Status& status) {
  const uint32_t code = static_cast<uint32_t>(status.code());
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((code >> (8 * i)) & 0xff);
  out.append(status.message().data(), status.message().size());
  return out;
}

absl::Status DecodeStatus(const std::string& bytes) {
  uint32_t code = 0;
  for (int i = 0; i < 4; ++i)
    code |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  return absl::Status(static_cast<absl::StatusCode>(code), bytes.substr(4));
}

absl::Status RunRank(const ProcessWorldOptions& options, const std::string& store_path, int port,
                     int rank, const ProcessBody& body) {
  at::set_num_threads(options.intra_op_threads);
  absl::StatusOr<std::shared_ptr<collectives::Rendezvous>> rendezvous =
      options.tcp_store ? collectives::Rendezvous::Tcp("127.0.0.1", port, rank, options.world_size,
                                                       options.collective_timeout)
                        : collectives::Rendezvous::File(store_path, rank, options.world_size,
                                                        options.collective_timeout);
  if (!rendezvous.ok()) return rendezvous.status();
  collectives::GlooCommunicator::Options gloo;
  gloo.timeout = options.collective_timeout;
  gloo.hostname = "127.0.0.1";
  auto world = collectives::GlooCommunicator::Create(*rendezvous, gloo);
  if (!world.ok()) return world.status();
  // Every rank is connected before any body runs: a rank whose body ends at once (and exits)
  // must not close its connections while a slower peer is still setting up its own.
  if (absl::Status s = (*world)->Barrier(); !s.ok()) {
    return Annotate(s, "while waiting for every rank to join");
  }
  return CallTorch(absl::StrCat("rank ", rank, "'s body"), [&] { return body(rank, **world); });
}

}  // namespace

std::vector<absl::Status> RunProcessWorld(const ProcessWorldOptions& options, ProcessBody body) {
  const int n = options.world_size;
  CHECK_GT(n, 0) << "world_size must be positive";
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir_template = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/process_world.XXXXXX");
  CHECK(mkdtemp(dir_template.data()) != nullptr) << "mkdtemp: " << std::strerror(errno);
  const std::string store_path = dir_template + "/store";
  int port = 0;
  if (options.tcp_store) {
    absl::StatusOr<int> free_port = FreeLoopbackPort();
    CHECK(free_port.ok()) << free_port.status();
    port = *free_port;
  }

  std::vector<pid_t> pids(n, -1);
  std::vector<int> fds(n, -1);
  std::vector<std::string> reports(n);
  std::vector<absl::Status> results(n);
  for (int rank = 0; rank < n; ++rank) {
    int pipe_fds[2];
    CHECK_EQ(pipe(pipe_fds), 0) << "pipe: " << std::strerror(errno);
    const pid_t pid = fork();
    CHECK_GE(pid, 0) << "fork: " << std::strerror(errno);
    if (pid == 0) {
      close(pipe_fds[0]);
      for (int fd : fds)
        if (fd >= 0) close(fd);
      const absl::Status status = RunRank(options, store_path, port, rank, body);
      WriteAll(pipe_fds[1], EncodeStatus(status));
      close(pipe_fds[1]);
      // Skip static destructors and atexit handlers inherited from the parent test binary.
      _exit(0);
    }
    close(pipe_fds[1]);
    pids[rank] = pid;
    fds[rank] = pipe_fds[0];
  }

  const absl::Time deadline = absl::Now() + options.deadline;
  int open_pipes = n;
  while (open_pipes > 0) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) break;
    std::vector<pollfd> polled;
    std::vector<int> ranks;
    for (int r = 0; r < n; ++r) {
      if (fds[r] < 0) continue;
      polled.push_back({fds[r], POLLIN, 0});
      ranks.push_back(r);
    }
    const int ready = poll(polled.data(), polled.size(), static_cast<int>(left_ms));
    if (ready < 0 && errno == EINTR) continue;
    CHECK_GE(ready, 0) << "poll: " << std::strerror(errno);
    for (size_t i = 0; i < polled.size(); ++i) {
      if (polled[i].revents == 0) continue;
      const int r = ranks[i];
      char buffer[4096];
      const ssize_t got = read(fds[r], buffer, sizeof(buffer));
      if (got < 0 && errno == EINTR) continue;
      if (got > 0) {
        reports[r].append(buffer, static_cast<size_t>(got));
      } else {
        close(fds[r]);
        fds[r] = -1;
        --open_pipes;
      }
    }
  }

  for (int r = 0; r < n; ++r) {
    const bool timed_out = fds[r] >= 0;
    if (timed_out) {
      kill(pids[r], SIGKILL);
      close(fds[r]);
    }
    int wstatus = 0;
    while (waitpid(pids[r], &wstatus, 0) < 0 && errno == EINTR) {
    }
    if (timed_out) {
      results[r] = absl::DeadlineExceededError(absl::StrCat("rank ", r, " did not finish within ",
                                                            absl::FormatDuration(options.deadline),
                                                            " and was killed"));
    } else if (reports[r].size() >= 4) {
      results[r] = DecodeStatus(reports[r]);
    } else if (WIFSIGNALED(wstatus)) {
      results[r] = absl::AbortedError(absl::StrCat("rank ", r, " was killed by signal ",
                                                   WTERMSIG(wstatus), " before reporting"));
    } else {
      results[r] = absl::AbortedError(absl::StrCat("rank ", r, " exited with code ",
                                                   WEXITSTATUS(wstatus), " before reporting"));
    }
  }
  unlink(store_path.c_str());
  rmdir(dir_template.c_str());
  return results;
}

}  // namespace testing
}  // namespace lockstep
