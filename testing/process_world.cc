#include "testing/process_world.h"

#include "base/temp_dir.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "ATen/Parallel.h"
#include "absl/strings/str_cat.h"
#include "base/posix_io.h"
#include "base/status_macros.h"
#include "base/subprocess.h"
#include "base/torch_boundary.h"
#include "collectives/gloo_communicator.h"
#include "collectives/rendezvous.h"

namespace lockstep {
namespace collectives {
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
  absl::StatusOr<std::shared_ptr<Rendezvous>> rendezvous =
      options.tcp_store
          ? Rendezvous::Tcp("127.0.0.1", port, rank, options.world_size, options.collective_timeout)
          : Rendezvous::File(store_path, rank, options.world_size, options.collective_timeout);
  if (!rendezvous.ok()) return rendezvous.status();
  GlooCommunicator::Options gloo;
  gloo.timeout = options.collective_timeout;
  gloo.engine_timeout = options.engine_timeout;
  gloo.hostname = "127.0.0.1";
  auto world = GlooCommunicator::Create(*rendezvous, gloo);
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
  if (n <= 0) {
    return {absl::InvalidArgumentError(
        absl::StrCat("a process world needs at least one rank, not ", n))};
  }
  std::vector<absl::Status> results(n);
  std::string dir = absl::StrCat(TempDir::Root(), "/process_world.XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    results.assign(n, absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno))));
    return results;
  }
  const std::string store_path = dir + "/store";
  int port = 0;
  if (options.tcp_store) {
    absl::StatusOr<int> free_port = FreeLoopbackPort();
    if (!free_port.ok()) {
      rmdir(dir.c_str());
      results.assign(n, free_port.status());
      return results;
    }
    port = *free_port;
  }

  std::vector<Child> children;
  std::vector<std::string> reports(n);
  for (int rank = 0; rank < n; ++rank) {
    absl::StatusOr<Child> child = Child::Fork(ChildOptions::Reporting(), [&, rank](int channel) {
      const absl::Status status = RunRank(options, store_path, port, rank, body);
      WriteAll(channel, EncodeStatus(status));
      return 0;
    });
    if (!child.ok()) {
      results.assign(n, Annotate(child.status(), absl::StrCat("starting rank ", rank)));
      children.clear();  // kills and reaps the ranks already started
      unlink(store_path.c_str());
      rmdir(dir.c_str());
      return results;
    }
    children.push_back(std::move(*child));
  }
  std::vector<Child*> pointers;
  for (Child& child : children) pointers.push_back(&child);

  const absl::Time deadline = absl::Now() + options.deadline;
  absl::Status polling;
  while (absl::Now() < deadline) {
    absl::StatusOr<int> open =
        PollChannels(pointers, deadline - absl::Now(), [&](size_t rank, absl::string_view bytes) {
          reports[rank].append(bytes.data(), bytes.size());
        });
    if (!open.ok()) polling = open.status();
    if (!open.ok() || *open == 0) break;
  }

  for (int r = 0; r < n; ++r) {
    Child& child = children[r];
    const bool timed_out = child.channel() >= 0;
    if (timed_out) child.Signal(SIGKILL);
    child.Reap();
    if (timed_out) {
      results[r] = !polling.ok() ? polling
                                 : absl::DeadlineExceededError(absl::StrCat(
                                       "rank ", r, " did not finish within ",
                                       absl::FormatDuration(options.deadline), " and was killed"));
    } else if (reports[r].size() >= 4) {
      results[r] = DecodeStatus(reports[r]);
    } else {
      results[r] =
          absl::AbortedError(absl::StrCat("rank ", r, " ", child.Describe(), " before reporting"));
    }
  }
  unlink(store_path.c_str());
  rmdir(dir.c_str());
  return results;
}

}  // namespace collectives
}  // namespace lockstep
