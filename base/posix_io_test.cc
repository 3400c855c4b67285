// base/posix_io: WriteAll writes every byte (large writes into a pipe read concurrently) and
// reports a closed reader; FreeLoopbackPort gives a port that can be bound.

#include "base/posix_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "base/status_testutil.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace {

TEST(WriteAllTest, WritesEveryByteThroughShortWrites) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const std::string payload(1 << 20, 'x');  // far beyond a pipe's buffer: many short writes
  std::string received;
  std::thread reader([&] {
    char buffer[4096];
    ssize_t got;
    while ((got = read(fds[0], buffer, sizeof(buffer))) > 0) received.append(buffer, got);
  });
  EXPECT_TRUE(WriteAll(fds[1], payload));
  close(fds[1]);
  reader.join();
  close(fds[0]);
  EXPECT_EQ(received, payload);
}

TEST(WriteAllTest, ReportsAReaderThatIsGone) {
  signal(SIGPIPE, SIG_IGN);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  close(fds[0]);
  EXPECT_FALSE(WriteAll(fds[1], "nobody reads this"));
  close(fds[1]);
  EXPECT_TRUE(WriteAll(fds[1] + 1000, "")) << "an empty write needs no descriptor";
}

TEST(FreeLoopbackPortTest, ThePortCanBeBound) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(int port, FreeLoopbackPort());
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);
}

}  // namespace
}  // namespace lockstep
