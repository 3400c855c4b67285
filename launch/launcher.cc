#include "launch/launcher.h"

#include <signal.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "base/posix_io.h"
#include "base/subprocess.h"

namespace lockstep {
namespace launch {
namespace {

volatile sig_atomic_t g_stop_signal = 0;

void OnStopSignal(int signal) { g_stop_signal = signal; }

// A rank's output is forwarded a line at a time, each line prefixed with the rank. A line ends at
// '\n' or at '\r' (progress a rank redraws in place: each state is shown as it is written, and a
// terminal still draws it over the last), or after kMaxPendingLine bytes without either (forwarded
// then with a '\n', so that a rank writing without line ends costs the launcher bounded memory).
// "\r\n" ends one line, also when the '\n' comes in a later read than the '\r'.
constexpr size_t kMaxPendingLine = size_t{64} << 10;

// One rank's output between reads.
struct PendingOutput {
  std::string line;       // the unfinished line: it holds no line end
  bool after_cr = false;  // the last line forwarded ended with a '\r'
};

// Appends `bytes` to the rank's unfinished line and moves the lines it completes (all of it at
// end of stream) into the returned text, each prefixed with the rank. Only the new bytes are
// searched, so the work is linear in the output.
std::string TakeLines(int rank, PendingOutput* pending, absl::string_view bytes,
                      bool end_of_stream) {
  std::string out;
  if (pending->after_cr && !bytes.empty() && bytes.front() == '\n') {
    out = "\n";  // the end of a "\r\n" whose '\r' was forwarded already
    bytes.remove_prefix(1);
  }
  if (!bytes.empty()) pending->after_cr = false;
  std::string& line = pending->line;
  const size_t search = line.size();
  line.append(bytes.data(), bytes.size());
  size_t start = 0;
  auto emit = [&](size_t end, absl::string_view ending) {
    absl::StrAppend(&out, "[rank ", rank, "] ", absl::string_view(line).substr(start, end - start),
                    ending);
    start = end;
  };
  for (size_t end = line.find_first_of("\r\n", search); end != std::string::npos;
       end = line.find_first_of("\r\n", start)) {
    if (line[end] == '\r' && end + 1 < line.size() && line[end + 1] == '\n') ++end;
    pending->after_cr = line[end] == '\r';
    emit(end + 1, "");
  }
  if (start < line.size()) pending->after_cr = false;  // bytes follow the '\r' in this line
  while (line.size() - start > kMaxPendingLine) emit(start + kMaxPendingLine, "\n");
  if (end_of_stream && start < line.size()) emit(line.size(), "\n");
  line.erase(0, start);
  return out;
}

// Installs the launcher's SIGINT/SIGTERM handlers for its lifetime.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction action {};
    action.sa_handler = OnStopSignal;
    sigemptyset(&action.sa_mask);
    g_stop_signal = 0;
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

}  // namespace

absl::Status ValidateLaunchOptions(const LaunchOptions& options) {
  if (options.nproc < 1 || options.nproc > kMaxLocalProcesses) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--nproc ", options.nproc, " is not an integer in [1, ", kMaxLocalProcesses, "]"));
  }
  if (options.nnodes < 1 || options.nnodes > kMaxNodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nnodes ", options.nnodes, " is not an integer in [1, ", kMaxNodes, "]"));
  }
  if (options.node_rank < 0 || options.node_rank >= options.nnodes) {
    return absl::InvalidArgumentError(absl::StrCat("--node_rank ", options.node_rank,
                                                   " is not an integer in [0, ", options.nnodes,
                                                   ") (--nnodes ", options.nnodes, ")"));
  }
  if (options.nnodes > 1 && options.master_port == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--master_port must be given with --nnodes ", options.nnodes,
        ": every node's launch needs the same port, which a free local port would not be"));
  }
  if (options.master_addr.empty()) {
    return absl::InvalidArgumentError("--master_addr is empty; give a host name or address");
  }
  if (options.master_port < 0 || options.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--master_port ", options.master_port, " is not an integer in [0, 65535]"));
  }
  if (options.grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--grace_seconds ", absl::FormatDuration(options.grace), " must not be negative"));
  }
  if (options.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--deadline_seconds ", absl::FormatDuration(options.deadline), " must be positive"));
  }
  if (options.command.empty()) {
    return absl::InvalidArgumentError("no program given; usage: launch [FLAGS] -- PROGRAM [ARGS]");
  }
  return absl::OkStatus();
}

absl::StatusOr<LaunchResult> Launch(const LaunchOptions& options) {
  if (absl::Status s = ValidateLaunchOptions(options); !s.ok()) return s;
  int port = options.master_port;
  if (port == 0) {
    absl::StatusOr<int> free_port = FreeLoopbackPort();
    if (!free_port.ok()) return free_port.status();
    port = *free_port;
  }

  StopSignals signals;
  std::vector<Child> ranks;
  const int first = options.node_rank * options.nproc;  // this node's first global rank
  const int world = options.nnodes * options.nproc;
  ChildOptions child_options = ChildOptions::Output();
  child_options.own_process_group = true;  // a rank's own children are stopped with it
  for (int r = 0; r < options.nproc; ++r) {
    absl::StatusOr<Child> child =
        Child::Exec(child_options, options.command,
                    {{"MASTER_ADDR", options.master_addr},
                     {"MASTER_PORT", std::to_string(port)},
                     {"RANK", std::to_string(first + r)},
                     {"WORLD_SIZE", std::to_string(world)},
                     {"LOCAL_RANK", std::to_string(r)},
                     {"LOCAL_WORLD_SIZE", std::to_string(options.nproc)},
                     {"GROUP_RANK", std::to_string(options.node_rank)},
                     {"GROUP_WORLD_SIZE", std::to_string(options.nnodes)}});
    if (!child.ok()) return child.status();  // the ranks started so far are killed with `ranks`
    LOCKSTEP_VLOG(1) << "launch: started rank " << first + r << " of " << world << " as pid "
                     << child->pid() << " (port " << port << ")";
    ranks.push_back(std::move(*child));
  }
  std::vector<Child*> channels;
  for (Child& rank : ranks) channels.push_back(&rank);
  std::vector<PendingOutput> pending(options.nproc);

  LaunchResult result;
  const absl::Time deadline = absl::Now() + options.deadline;
  absl::Time kill_at = absl::InfiniteFuture();
  auto signal_running = [&](int signal) {
    for (Child& rank : ranks) rank.Signal(signal);
  };
  auto stop_others = [&](const std::string& why) {
    if (kill_at != absl::InfiniteFuture()) return;
    WriteAll(options.output_fd, absl::StrCat("[launch] ", why, "; stopping the other ranks\n"));
    signal_running(SIGTERM);
    kill_at = absl::Now() + options.grace;
  };

  int running = options.nproc;
  while (running > 0) {
    if (g_stop_signal != 0 && result.failed_rank < 0 && kill_at == absl::InfiniteFuture()) {
      result.exit_code = 128 + g_stop_signal;
      result.summary = absl::StrCat("launcher received signal ", static_cast<int>(g_stop_signal));
      stop_others(result.summary);
    }
    if (absl::Now() >= deadline && result.stalled_ranks.empty() && result.failed_rank < 0) {
      for (int r = 0; r < options.nproc; ++r) {
        if (!ranks[r].exited()) result.stalled_ranks.push_back(first + r);
      }
      result.exit_code = 124;  // timeout(1)'s convention
      result.summary = absl::StrCat("rank(s) ", absl::StrJoin(result.stalled_ranks, ", "),
                                    " still running after the job deadline of ",
                                    absl::FormatDuration(options.deadline));
      stop_others(result.summary);
    }
    if (absl::Now() >= kill_at) signal_running(SIGKILL);

    // Also the period at which exits are reaped and signals noticed.
    absl::StatusOr<int> open =
        PollChannels(channels, absl::Milliseconds(100), [&](size_t r, absl::string_view bytes) {
          WriteAll(options.output_fd,
                   TakeLines(first + static_cast<int>(r), &pending[r], bytes, bytes.empty()));
        });
    if (!open.ok()) {
      signal_running(SIGKILL);
      return open.status();
    }
    if (*open == 0) absl::SleepFor(absl::Milliseconds(100));

    for (int r = 0; r < options.nproc; ++r) {
      Child& rank = ranks[r];
      if (rank.exited() || !rank.TryReap()) continue;
      --running;
      LOCKSTEP_VLOG(1) << "launch: rank " << first + r << " " << rank.Describe() << "; " << running
                       << " still running";
      if (!rank.succeeded() && result.failed_rank < 0 && result.exit_code == 0) {
        result.failed_rank = first + r;
        result.exit_code = rank.ExitCode();
        result.summary = absl::StrCat("rank ", first + r, " ", rank.Describe());
        stop_others(result.summary);
      }
    }
  }
  // Drain what the ranks wrote just before exiting; a descendant that keeps a pipe open must
  // not hold the launcher, so stop as soon as a poll finds nothing more to read.
  for (bool read_any = true; read_any;) {
    read_any = false;
    absl::StatusOr<int> open =
        PollChannels(channels, absl::ZeroDuration(), [&](size_t r, absl::string_view bytes) {
          read_any = true;
          WriteAll(options.output_fd,
                   TakeLines(first + static_cast<int>(r), &pending[r], bytes, bytes.empty()));
        });
    if (!open.ok() || *open == 0) break;
  }
  for (int r = 0; r < options.nproc; ++r) {
    WriteAll(options.output_fd, TakeLines(first + r, &pending[r], {}, /*end_of_stream=*/true));
  }
  if (result.summary.empty()) {
    result.summary = options.nnodes == 1
                         ? absl::StrCat("all ", options.nproc, " ranks exited with code 0")
                         : absl::StrCat("all ", options.nproc, " ranks of node ", options.node_rank,
                                        " (ranks ", first, "..", first + options.nproc - 1, " of ",
                                        world, ") exited with code 0");
  }
  return result;
}

}  // namespace launch
}  // namespace lockstep
