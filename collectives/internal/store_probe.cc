#include "collectives/internal/store_probe.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"
#if __has_include("torch/csrc/distributed/c10d/TCPStoreBackend.hpp")
#include "torch/csrc/distributed/c10d/TCPStoreBackend.hpp"  // LibTorch 2.x: QueryType, the magic
#define LOCKSTEP_TCPSTORE_VALIDATES 1
#endif

namespace lockstep {
namespace collectives {
namespace internal {

namespace {

std::chrono::milliseconds UntilMs(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(0),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}

// A socket closed when it goes out of scope.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Waits until `fd` is ready for `events` or `deadline` passes; false on the deadline.
bool PollUntil(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd entry{fd, events, 0};
    const int ready = poll(&entry, 1, static_cast<int>(UntilMs(deadline).count()));
    if (ready > 0) return true;
    if (ready == 0 || errno != EINTR) return false;
  }
}

// One non-blocking connection attempt to each of `addresses` in turn; the connected socket, or -1
// with `error` saying why the last attempt failed.
// The addresses of host:port for a TCP stream (`flags`: getaddrinfo's, e.g. AI_NUMERICHOST), or
// getaddrinfo's error code; freed with the pointer.
using Addresses = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;
Addresses Resolve(const std::string& host, int port, int flags, int* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags;
  addrinfo* found = nullptr;
  *error = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  return Addresses(*error == 0 ? found : nullptr, &freeaddrinfo);
}

int ConnectOnce(const addrinfo* addresses, Clock::time_point deadline, std::string* error) {
  for (const addrinfo* a = addresses; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *error = std::strerror(errno);
      continue;
    }
    int result = connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (result == EINPROGRESS) {
      if (!PollUntil(fd, POLLOUT, deadline)) {
        result = ETIMEDOUT;
      } else {
        socklen_t length = sizeof(result);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &result, &length) != 0) result = errno;
      }
    }
    if (result == 0) return fd;
    *error = std::strerror(result);
    close(fd);
  }
  return -1;
}

// The bytes of add(key, value) as a c10d TCPStore client sends them on a new connection: the
// query type, the key (64-bit length, then bytes), the 64-bit value, in host byte order. LibTorch
// 2.x servers also require each connection to open with VALIDATE and their magic number. 1.13's
// QueryType is private to its TCPStore.cpp: ADD is 3 there (SET, COMPARE_SET, GET, ADD, ...).
std::string AddQuery(const std::string& key, int64_t value) {
  std::string query;
  auto append = [&query](const auto& v) {
    query.append(reinterpret_cast<const char*>(&v), sizeof(v));
  };
#ifdef LOCKSTEP_TCPSTORE_VALIDATES
  append(static_cast<uint8_t>(c10d::detail::QueryType::VALIDATE));
  append(static_cast<uint32_t>(c10d::detail::validationMagicNumber));
  append(static_cast<uint8_t>(c10d::detail::QueryType::ADD));
#else
  append(uint8_t{3});
#endif
  append(static_cast<uint64_t>(key.size()));
  query += key;
  append(value);
  return query;
}

}  // namespace

// An add() of a random value on a key of its own must come back as exactly that value, 8 bytes.

absl::Status ProbeStore(const std::string& host, int port, absl::Duration timeout,
                        Clock::time_point deadline) {
  const std::string address = absl::StrCat(host, ":", port);
  const std::string joining = absl::StrCat("joining the TCP store at ", address, ": ");
  int lookup = 0;
  const Addresses found = Resolve(host, port, 0, &lookup);
  if (lookup != 0) {
    return absl::UnavailableError(
        absl::StrCat(joining, "cannot resolve '", host, "' (MASTER_ADDR): ", gai_strerror(lookup)));
  }
  std::string error = "no address";
  int fd = -1;
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    fd = ConnectOnce(found.get(), deadline, &error);
    if (fd >= 0 || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::min(backoff, UntilMs(deadline)));
    backoff = std::min(2 * backoff, std::chrono::milliseconds(250));
  }
  if (fd < 0) {
    return absl::DeadlineExceededError(absl::StrCat(
        joining, "nothing accepted a connection within ", absl::FormatDuration(timeout), " (",
        error, "); global rank 0, which serves the store, did not start or cannot be reached"));
  }
  const Socket socket(fd);
  std::random_device entropy;
  const int64_t value =
      static_cast<int64_t>((uint64_t{entropy()} << 31) ^ entropy()) & 0x3fffffffffffffff;
  const std::string query =
      AddQuery(absl::StrCat("lockstep/rendezvous/probe/", getpid(), "/", value), value);
  const std::string silent = absl::StrCat(
      joining, address, " accepted the connection but did not answer a store query within ",
      absl::FormatDuration(timeout),
      "; what listens there is not global rank 0's store, or that process is stopped");
  // Closed or reset with no reply at all: more likely the link (or rank 0) gone than a wrong
  // peer, and what the caller does next is the same as for a store lost later.
  auto lost = [&](const std::string& why) {
    return absl::UnavailableError(
        absl::StrCat(joining,
                     "the connection to the rendezvous store was lost before it answered a store "
                     "query (",
                     why,
                     "); global rank 0, which serves it, is gone or the link to its host is "
                     "down (or what listens there closes connections it does not understand)"));
  };
  for (size_t sent = 0; sent < query.size();) {
    if (!PollUntil(fd, POLLOUT, deadline)) return absl::DeadlineExceededError(silent);
    const ssize_t n = send(fd, query.data() + sent, query.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) return lost(std::strerror(errno));
    if (n > 0) sent += static_cast<size_t>(n);
  }
  char reply[sizeof(int64_t)];
  size_t got = 0;
  while (got < sizeof(reply)) {
    if (!PollUntil(fd, POLLIN, deadline)) return absl::DeadlineExceededError(silent);
    const ssize_t n = recv(fd, reply + got, sizeof(reply) - got, 0);
    if (n == 0 && got == 0) return lost("closed without a reply");
    if (n == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(address, " did not answer as a c10d store: it closed the connection after ",
                       got, " of the ", sizeof(reply), " bytes of a reply to a store query"));
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) return lost(std::strerror(errno));
    if (n > 0) got += static_cast<size_t>(n);
  }
  int64_t answer = 0;
  std::memcpy(&answer, reply, sizeof(answer));
  if (answer != value) {
    return absl::FailedPreconditionError(absl::StrCat(
        address, " did not answer as a c10d store: a store query (add ", value,
        " to a new key) was answered with the bytes ", absl::BytesToHexString({reply, got}),
        "; is MASTER_PORT another service's port, or rank 0 built with another LibTorch?"));
  }
  return absl::OkStatus();
}

// LibTorch takes a listening socket from 2.3 on, and its libuv store (the default from 2.4)
// from 2.4; torch/headeronly/version.h first shipped after both, so its presence is the test.
#if __has_include("torch/headeronly/version.h")
#define LOCKSTEP_STORE_TAKES_A_SOCKET 1
#else
#define LOCKSTEP_STORE_TAKES_A_SOCKET 0
#endif

bool StoreTakesASocket() { return LOCKSTEP_STORE_TAKES_A_SOCKET; }

absl::StatusOr<int> ListenOnStoreAddress(const std::string& host, int port) {
  // A numeric address only: a host name may resolve on rank 0's machine to an address the other
  // nodes do not use (Debian maps its own name to 127.0.1.1).
  int lookup = 0;
  const Addresses found = Resolve(host, port, AI_NUMERICHOST, &lookup);
  if (lookup != 0) {
    return absl::UnavailableError(
        absl::StrCat("MASTER_ADDR '", host, "' is not a numeric address: ", gai_strerror(lookup)));
  }
  std::string error = "no address";
  int fd = -1;
  for (const addrinfo* a = found.get(); a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
      error = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", host, ":", port, " (MASTER_ADDR): ", error));
  }
  return fd;
}

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep
