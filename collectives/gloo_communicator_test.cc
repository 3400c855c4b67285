#include "collectives/gloo_communicator.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/posix_io.h"
#include "base/status_macros.h"
#include "base/status_testutil.h"
#include "base/stopwatch.h"
#include "base/subprocess.h"
#include "c10/core/Allocator.h"
#include "c10/core/CPUAllocator.h"
#include "collectives/agreement.h"
#include "collectives/internal/store_probe.h"
#include "collectives/rendezvous.h"
#include "collectives/topology.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/collective_calls.h"
#include "testing/process_world.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"
#include "torch/version.h"

namespace lockstep {
namespace collectives {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

absl::Status Expect(bool condition, const std::string& what) {
  return condition ? absl::OkStatus() : absl::InternalError(what);
}

void ExpectAllOk(const std::vector<absl::Status>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  }
}

collectives::ProcessWorldOptions World(int n) {
  collectives::ProcessWorldOptions options;
  options.world_size = n;
  options.collective_timeout = absl::Seconds(20);
  return options;
}

class GlooWorldSizes : public ::testing::TestWithParam<int> {};

TEST_P(GlooWorldSizes, EveryCollectiveMovesTheRightValues) {
  const int n = GetParam();
  ExpectAllOk(
      collectives::RunProcessWorld(World(n), [n](int rank, Communicator& world) -> absl::Status {
        LOCKSTEP_RETURN_IF_ERROR(Expect(world.rank() == rank && world.size() == n, "identity"));
        // Broadcast from the last rank (a nonzero root).
        at::Tensor b = at::full({4}, rank * 1.5, at::kFloat);
        LOCKSTEP_RETURN_IF_ERROR(world.Broadcast(b, n - 1));
        LOCKSTEP_RETURN_IF_ERROR(
            Expect(at::equal(b, at::full({4}, (n - 1) * 1.5, at::kFloat)), "broadcast"));
        // All-gather.
        auto gathered = world.AllGather(at::arange(3, at::kLong) + 10 * rank);
        if (!gathered.ok()) return gathered.status();
        for (int m = 0; m < n; ++m) {
          LOCKSTEP_RETURN_IF_ERROR(
              Expect(at::equal((*gathered)[m], at::arange(3, at::kLong) + 10 * m),
                     absl::StrCat("all-gather member ", m)));
        }
        // bfloat16, which Gloo itself refuses: broadcast and all-gathered as bytes.
        at::Tensor h = at::full({2, 3}, rank + 0.5, at::kBFloat16);
        LOCKSTEP_RETURN_IF_ERROR(world.Broadcast(h, n - 1));
        LOCKSTEP_RETURN_IF_ERROR(
            Expect(at::equal(h, at::full({2, 3}, n - 0.5, at::kBFloat16)), "bfloat16 broadcast"));
        auto halves = world.AllGather(at::full({2, 3}, rank + 0.25, at::kBFloat16));
        if (!halves.ok()) return halves.status();
        for (int m = 0; m < n; ++m) {
          LOCKSTEP_RETURN_IF_ERROR(
              Expect(at::equal((*halves)[m], at::full({2, 3}, m + 0.25, at::kBFloat16)),
                     absl::StrCat("bfloat16 all-gather member ", m)));
        }
        // All-reduce.
        at::Tensor s = at::full({2, 2}, rank + 1.0, at::kDouble);
        LOCKSTEP_RETURN_IF_ERROR(world.AllReduceSum(s));
        LOCKSTEP_RETURN_IF_ERROR(
            Expect(at::equal(s, at::full({2, 2}, n * (n + 1) / 2.0, at::kDouble)), "all-reduce"));
        LOCKSTEP_RETURN_IF_ERROR(world.Barrier());
        // Bytes from rank 0, of a length only the root knows.
        std::string bytes = rank == 0 ? std::string(1000, 'q') + "end" : "";
        LOCKSTEP_RETURN_IF_ERROR(BroadcastBytes(world, &bytes, 0));
        return Expect(bytes == std::string(1000, 'q') + "end", "bytes");
      }));
}

INSTANTIATE_TEST_SUITE_P(TwoAndFourProcesses, GlooWorldSizes, ::testing::Values(2, 4));

TEST(GlooCommunicatorTest, DpTwoCpTwoGroupsUseTheirOwnLeaders) {
  ExpectAllOk(
      collectives::RunProcessWorld(World(4), [](int rank, Communicator& world) -> absl::Status {
        LOCKSTEP_ASSIGN_OR_RETURN(const Topology topo, Topology::Create(4, /*tp=*/1, /*cp=*/2));
        auto cp = world.NewGroup(topo.CpGroup(rank));
        if (!cp.ok()) return cp.status();
        auto dp = world.NewGroup(topo.DpGroup(rank));
        if (!dp.ok()) return dp.status();
        // Group rank 0 of the CP group of ranks {2, 3} is global rank 2.
        LOCKSTEP_ASSIGN_OR_RETURN(const int leader, (*cp)->GlobalRank(0));
        LOCKSTEP_RETURN_IF_ERROR(Expect(leader == Topology::Leader(topo.CpGroup(rank)), "leader"));
        at::Tensor t = at::full({1}, 100.0 + rank, at::kDouble);
        LOCKSTEP_RETURN_IF_ERROR((*cp)->Broadcast(t, 0));
        LOCKSTEP_RETURN_IF_ERROR(
            Expect(t.item<double>() == 100.0 + topo.CpGroup(rank)[0], "cp broadcast"));
        at::Tensor u = at::full({1}, 1.0 * rank, at::kDouble);
        LOCKSTEP_RETURN_IF_ERROR((*dp)->AllReduceSum(u));
        const auto d = topo.DpGroup(rank);
        LOCKSTEP_RETURN_IF_ERROR(Expect(u.item<double>() == d[0] + d[1], "dp all-reduce"));
        // The same rank list again is a separate group (second context), still consistent.
        auto cp_again = world.NewGroup(topo.CpGroup(rank));
        if (!cp_again.ok()) return cp_again.status();
        return (*cp_again)->Barrier();
      }));
}

TEST(GlooCommunicatorTest, AgreementCheckNamesTheDisagreeingRank) {
  std::vector<absl::Status> results =
      collectives::RunProcessWorld(World(4), [](int rank, Communicator& world) {
        return CheckAgreement(world, "register_object", rank == 3 ? "v2" : "v1");
      });
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), AllOf(HasSubstr("[0, 1, 2] hold"), HasSubstr("[3] hold")));
  }
}

// Members calling different collectives — another size, another kind, another root — get the same
// kFailedPrecondition naming every member's call, promptly, instead of Gloo's size check aborting
// the process (SIGABRT, reported by the process world as a rank killed by signal 6).
TEST(GlooCommunicatorTest, OutOfStepCollectivesAreAnErrorOnEveryMemberNeverAnAbort) {
  struct Case {
    const char* name;
    std::function<absl::Status(int rank, Communicator& world)> call;
    const char* rank1_called;
  };
  const std::vector<Case> cases = {
      {"all-gathers of other sizes",
       [](int rank, Communicator& world) {
         return world.AllGather(at::zeros({rank == 0 ? 4 : 6})).status();
       },
       "all-gather of 24 bytes of Float"},
      {"a broadcast against an all-gather",
       [](int rank, Communicator& world) {
         at::Tensor t = at::zeros({4});
         return rank == 0 ? world.Broadcast(t, 0) : world.AllGather(t).status();
       },
       "all-gather of 16 bytes of Float"},
      {"broadcasts from other roots",
       [](int rank, Communicator& world) {
         at::Tensor t = at::zeros({4});
         return world.Broadcast(t, rank == 0 ? 0 : 1);
       },
       "broadcast from group rank 1 of 16 bytes"},
      {"an all-reduce against a barrier",
       [](int rank, Communicator& world) {
         at::Tensor t = at::zeros({2}, at::kLong);
         return rank == 0 ? world.AllReduceSum(t) : world.Barrier();
       },
       "barrier (collective #"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Stopwatch start;
    std::vector<absl::Status> results =
        collectives::RunProcessWorld(World(2), [&](int rank, Communicator& world) -> absl::Status {
          LOCKSTEP_RETURN_IF_ERROR(world.Barrier());
          return c.call(rank, world);
        });
    EXPECT_LT(start.Elapsed(), absl::Seconds(10)) << "out of step must not wait for a timeout";
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << results[r];
      EXPECT_THAT(
          std::string(results[r].message()),
          AllOf(HasSubstr("out of step"), HasSubstr("group rank 0 (global rank 0) called"),
                HasSubstr(absl::StrCat("group rank 1 (global rank 1) called ", c.rank1_called))));
    }
  }
}

TEST(GlooCommunicatorTest, DeadPeerIsAnErrorWithinTheTimeoutAndTheCommunicatorIsUnusable) {
  collectives::ProcessWorldOptions options = World(2);
  options.collective_timeout = absl::Seconds(6);
  std::vector<absl::Status> results =
      collectives::RunProcessWorld(options, [](int rank, Communicator& world) -> absl::Status {
        LOCKSTEP_RETURN_IF_ERROR(world.Barrier());
        if (rank == 1) _exit(3);  // dies between collectives, without a word
        at::Tensor t = at::zeros({8});
        const Stopwatch start;
        absl::Status s = world.Broadcast(t, 0);
        const absl::Duration took = start.Elapsed();
        if (s.ok()) return absl::InternalError("broadcast to a dead peer succeeded");
        // Generous: the configured timeout plus the wait's backstop and scheduling slack.
        const absl::Duration bound = 2 * world.timeout() + absl::Seconds(5);
        if (took > bound) {
          return absl::InternalError(absl::StrCat("took ", absl::FormatDuration(took),
                                                  ", more than ", absl::FormatDuration(bound)));
        }
        // The shared contract: after an error the communicator is unusable.
        const absl::Status after = world.Barrier();
        if (after.code() != absl::StatusCode::kFailedPrecondition) {
          return absl::InternalError(
              absl::StrCat("a collective after the error gave ", after.ToString()));
        }
        return s;
      });
  EXPECT_THAT(results[0].code(),
              AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
      << results[0];
  EXPECT_THAT(results[0].message(), HasSubstr("broadcast from group rank 0 on gloo world [0, 1]"));
  EXPECT_THAT(results[0].message(), HasSubstr("global rank(s) [1] gone"));
  EXPECT_THAT(results[1].message(), HasSubstr("exited with code 3"));
}

// In a world of 4, rank 2 dies: every survivor's error names global rank 2, and only it.
TEST(GlooCommunicatorTest, EverySurvivorNamesTheRankThatDied) {
  collectives::ProcessWorldOptions options = World(4);
  options.collective_timeout = absl::Seconds(6);
  std::vector<absl::Status> results =
      collectives::RunProcessWorld(options, [](int rank, Communicator& world) -> absl::Status {
        LOCKSTEP_RETURN_IF_ERROR(world.Barrier());
        if (rank == 2) _exit(3);
        at::Tensor t = at::ones({1024});
        return world.AllReduceSum(t);
      });
  for (int r : {0, 1, 3}) {
    EXPECT_THAT(results[r].code(),
                AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
        << results[r];
    EXPECT_THAT(results[r].message(), HasSubstr("global rank(s) [2] gone"))
        << "rank " << r << ": " << results[r];
  }
}

// Creating a group after a member died: Gloo's connection fails naming only an address; the
// roll call under the round "create" names the member gone.
TEST(GlooCommunicatorTest, AGroupCreatedAfterAMemberDiedNamesIt) {
  collectives::ProcessWorldOptions options = World(3);
  options.collective_timeout = absl::Seconds(3);
  std::vector<absl::Status> results =
      collectives::RunProcessWorld(options, [](int rank, Communicator& world) -> absl::Status {
        LOCKSTEP_RETURN_IF_ERROR(world.Barrier());
        if (rank == 2) _exit(3);
        const Stopwatch start;
        absl::StatusOr<std::unique_ptr<Communicator>> group = world.NewGroup({0, 1, 2});
        if (group.ok()) return absl::InternalError("a group with a dead member was created");
        const absl::Duration bound = 2 * world.timeout() + absl::Seconds(5);
        if (start.Elapsed() > bound) {
          return absl::InternalError(absl::StrCat("took ", absl::FormatDuration(start.Elapsed()),
                                                  ", more than ", absl::FormatDuration(bound)));
        }
        return group.status();
      });
  for (int r : {0, 1}) {
    EXPECT_FALSE(results[r].ok());
    EXPECT_THAT(results[r].message(), AllOf(HasSubstr("creating gloo group [0, 1, 2]"),
                                            HasSubstr("global rank(s) [2] gone")))
        << "rank " << r << ": " << results[r];
  }
}

// SIGPIPE's handler and disposition as sigaction reports them.
void (*SigpipeHandler())(int) {
  struct sigaction current;
  sigaction(SIGPIPE, nullptr, &current);
  return current.sa_handler;
}

void SetSigpipeHandler(void (*handler)(int)) {
  struct sigaction action = {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  sigaction(SIGPIPE, &action, nullptr);
}

volatile sig_atomic_t sigpipes_handled = 0;
void CountSigpipe(int) { sigpipes_handled = sigpipes_handled + 1; }

// A survivor writing to a peer that died must get an error, not be killed by SIGPIPE (the world
// of 4 above lost a survivor that way): Create ignores SIGPIPE where it was at its default, and
// leaves a program's own handler in place. The world's processes inherit the disposition set
// here before they are forked and check it after their Create.
TEST(GlooCommunicatorTest, CreateIgnoresSigpipeAtItsDefaultAndKeepsTheProgramsHandler) {
  struct sigaction saved;
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &saved), 0);

  SetSigpipeHandler(SIG_DFL);
  ExpectAllOk(collectives::RunProcessWorld(World(2), [](int, Communicator&) {
    return Expect(SigpipeHandler() == SIG_IGN, "SIGPIPE is not ignored after Create");
  }));

  SetSigpipeHandler(CountSigpipe);
  ExpectAllOk(collectives::RunProcessWorld(World(2), [](int, Communicator&) -> absl::Status {
    LOCKSTEP_RETURN_IF_ERROR(
        Expect(SigpipeHandler() == CountSigpipe, "Create replaced the program's SIGPIPE handler"));
    raise(SIGPIPE);
    return Expect(sigpipes_handled == 1, "the program's SIGPIPE handler did not run");
  }));

  ASSERT_EQ(sigaction(SIGPIPE, &saved, nullptr), 0);
}

// A CPU allocator that throws c10::OutOfMemoryError for allocations of `threshold` bytes or
// more while armed, as a device allocator does when memory runs out.
class FailingCpuAllocator final : public c10::Allocator {
 public:
  FailingCpuAllocator(c10::Allocator* real, size_t threshold)
      : real_(real), threshold_(threshold) {}
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override { return Allocate(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return Allocate(n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return real_->raw_deleter(); }

 private:
  c10::DataPtr Allocate(size_t n) const {
    if (n >= threshold_) {
      throw c10::OutOfMemoryError({__func__, __FILE__, __LINE__},
                                  "injected: out of memory allocating " + std::to_string(n));
    }
    return real_->allocate(n);
  }
  c10::Allocator* real_;
  size_t threshold_;
};

TEST(GlooCommunicatorTest, OutOfMemoryInsideAllGatherIsResourceExhausted) {
  collectives::ProcessWorldOptions options = World(2);
  options.collective_timeout = absl::Seconds(3);
  std::vector<absl::Status> results =
      collectives::RunProcessWorld(options, [](int rank, Communicator& world) -> absl::Status {
        at::Tensor input = at::ones({1 << 16});
        if (rank == 0) {
          static FailingCpuAllocator failing(c10::GetCPUAllocator(), input.nbytes());
          c10::SetCPUAllocator(&failing, /*priority=*/255);
        }
        return world.AllGather(input).status();
      });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kResourceExhausted) << results[0];
  EXPECT_THAT(results[0].message(), AllOf(HasSubstr("all-gather on gloo world [0, 1]"),
                                          HasSubstr("injected: out of memory")));
  EXPECT_FALSE(results[1].ok()) << "the peer cannot complete an all-gather rank 0 never joined";
}

TEST(GlooCommunicatorTest, PeerThatNeverArrivesTimesOut) {
  collectives::ProcessWorldOptions options = World(2);
  options.collective_timeout = absl::Seconds(2);
  std::vector<absl::Status> results =
      collectives::RunProcessWorld(options, [](int rank, Communicator& world) -> absl::Status {
        LOCKSTEP_RETURN_IF_ERROR(world.Barrier());
        if (rank == 1) {
          absl::SleepFor(3 * world.timeout());  // alive, but late well beyond the timeout
          return absl::OkStatus();
        }
        at::Tensor t = at::zeros({8});
        const Stopwatch start;
        absl::Status s = world.AllReduceSum(t);
        const absl::Duration took = start.Elapsed();
        if (s.ok()) return absl::InternalError("all-reduce without the peer succeeded");
        // Within the timeout plus slack, and well before the late peer arrives.
        const absl::Duration bound = world.timeout() + absl::Seconds(3);
        if (took > bound) {
          return absl::InternalError(absl::StrCat("took ", absl::FormatDuration(took),
                                                  ", more than ", absl::FormatDuration(bound)));
        }
        return s;
      });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kDeadlineExceeded) << results[0];
  EXPECT_THAT(results[0].message(), HasSubstr("all-reduce (sum) on gloo world [0, 1]"));
  EXPECT_THAT(results[0].message(), HasSubstr("global rank(s) [1] alive but not answering"));
}

// Every collective with a peer that is alive but never arrives, Gloo's own timeout 30 times the
// communicator's: each call returns kDeadlineExceeded within the communicator's bound (its timeout,
// the wait's margin of at most the timeout again, the roll call), so the bound is the
// communicator's own and not Gloo's.
class GlooLatePeer : public ::testing::TestWithParam<CollectiveCall> {};

TEST_P(GlooLatePeer, EveryCollectiveIsBoundedByTheCommunicatorsTimeout) {
  const CollectiveCall call = GetParam();
  collectives::ProcessWorldOptions options = World(2);
  options.collective_timeout = absl::Seconds(1);
  options.engine_timeout = absl::Seconds(30);
  std::vector<absl::Status> results =
      collectives::RunProcessWorld(options, [call](int rank, Communicator& world) -> absl::Status {
        LOCKSTEP_RETURN_IF_ERROR(world.Barrier());
        if (rank == 1) {
          absl::SleepFor(absl::Seconds(6));  // alive, never calling
          return absl::OkStatus();
        }
        const Stopwatch start;
        const absl::Status s = RunCollectiveCall(call, world, c10::Device(c10::kCPU));
        const absl::Duration took = start.Elapsed();
        if (s.ok()) return absl::InternalError("the collective without its peer succeeded");
        const absl::Duration bound = 2 * world.timeout() + absl::Seconds(2);
        if (took > bound) {
          return absl::InternalError(absl::StrCat("took ", absl::FormatDuration(took),
                                                  ", more than ", absl::FormatDuration(bound)));
        }
        return s;
      });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kDeadlineExceeded)
      << CollectiveCallName(call) << ": " << results[0];
  EXPECT_THAT(std::string(results[0].message()),
              HasSubstr("global rank(s) [1] alive but not answering"));
}

INSTANTIATE_TEST_SUITE_P(EveryCollective, GlooLatePeer, ::testing::ValuesIn(AllCollectiveCalls()),
                         [](const ::testing::TestParamInfo<CollectiveCall>& info) {
                           std::string name = CollectiveCallName(info.param);
                           for (char& c : name) {
                             if (c == ' ' || c == '-') c = '_';
                           }
                           return name;
                         });

TEST(GlooCommunicatorTest, TcpStoreRendezvousWorks) {
  collectives::ProcessWorldOptions options = World(2);
  options.tcp_store = true;
  ExpectAllOk(collectives::RunProcessWorld(options, [](int rank, Communicator& world) {
    at::Tensor t = at::full({1}, 1.0 + rank);
    absl::Status s = world.AllReduceSum(t);
    if (!s.ok()) return s;
    return Expect(t.item<float>() == 3.0f, "sum");
  }));
}

// Rank 0 alone in a world of 2: the rendezvous fails within its timeout, naming the address,
// the world size, the rank that arrived and the one missing.
TEST(RendezvousTest, AMissingRankIsNamedWithinTheTimeout) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const int port, FreeLoopbackPort());
  const absl::Duration timeout = absl::Seconds(2);
  const Stopwatch start;
  auto rendezvous = Rendezvous::Tcp("127.0.0.1", port, 0, 2, timeout);
  const absl::Duration took = start.Elapsed();
  EXPECT_EQ(rendezvous.status().code(), absl::StatusCode::kDeadlineExceeded) << rendezvous.status();
  EXPECT_THAT(rendezvous.status().message(),
              AllOf(HasSubstr(absl::StrCat("127.0.0.1:", port)), HasSubstr("of world size 2"),
                    HasSubstr("(0, from host(s) "), HasSubstr("missing rank(s) 1")));
  EXPECT_LT(took, timeout + absl::Seconds(3));
  // The file store says the same.
  auto file = Rendezvous::File(absl::StrCat(::testing::TempDir(), "/alone_", port), 1, 3, timeout);
  EXPECT_THAT(file.status().message(),
              AllOf(HasSubstr("(1, from host(s) "), HasSubstr("missing rank(s) 0, 2")));
}

// With the ranks per node known (LOCAL_WORLD_SIZE), the missing ranks are named by node too: a
// node whose launch never came.
TEST(RendezvousTest, AMissingNodeIsNamed) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const int port, FreeLoopbackPort());
  auto rendezvous = Rendezvous::Tcp("127.0.0.1", port, 0, 4, absl::Seconds(1), /*local_rank=*/0,
                                    /*local_world_size=*/2);
  EXPECT_EQ(rendezvous.status().code(), absl::StatusCode::kDeadlineExceeded) << rendezvous.status();
  EXPECT_THAT(
      rendezvous.status().message(),
      AllOf(HasSubstr("missing rank(s) 1, 2, 3 (2 ranks per node, 2 nodes)"),
            HasSubstr("node(s) 1 sent no rank"), HasSubstr("node(s) 0 came with ranks missing")));
}

// The local addresses listening on `port` (/proc/net/tcp and tcp6, as the kernel prints them).
std::vector<std::string> ListeningAddresses(int port) {
  std::vector<std::string> found;
  const std::string suffix =
      absl::StrCat(":", absl::AsciiStrToUpper(absl::StrFormat("%04x", port)));
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the column names
    while (std::getline(in, line)) {
      const std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
      // fields: sl, local_address, rem_address, st (0A: LISTEN), ...
      if (fields.size() > 3 && fields[3] == "0A" && absl::EndsWith(fields[1], suffix)) {
        found.push_back(fields[1].substr(0, fields[1].size() - suffix.size()));
      }
    }
  }
  return found;
}

// Note [The store's address]: with MASTER_ADDR=127.0.0.1 the store listens there only, not on
// every interface, where LibTorch lets it take a socket.
TEST(RendezvousTest, TheStoreListensOnlyOnTheAddressTheJobNames) {
  if (!internal::StoreTakesASocket()) {
    GTEST_SKIP() << "not run: this LibTorch's TCPStore takes no socket (masterListenFd), so its "
                    "store listens on every interface";
  }
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const int port, FreeLoopbackPort());
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto rendezvous,
                                Rendezvous::Tcp("127.0.0.1", port, 0, 1, absl::Seconds(10)));
  const std::vector<std::string> listening = ListeningAddresses(port);
  ASSERT_FALSE(listening.empty()) << "nothing listens on port " << port;
  for (const std::string& address : listening) {
    EXPECT_EQ(address, "0100007F") << "the store listens on " << address << ", not 127.0.0.1";
  }
}

TEST(RendezvousTest, AnUnresolvableHostIsOneClearError) {
  const Stopwatch start;
  auto rendezvous =
      Rendezvous::Tcp("lockstep-no-such-host.invalid", 29500, 1, 2, absl::Seconds(30));
  EXPECT_EQ(rendezvous.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rendezvous.status().message(),
              HasSubstr("cannot resolve the rendezvous host 'lockstep-no-such-host.invalid'"));
  EXPECT_LT(start.Elapsed(), absl::Seconds(20));
}

TEST(RendezvousTest, EnvironmentRendezvousTimesOutWhenPeersNeverCome) {
  // Rank 1 of 2 with nobody serving the store: a clear error within the timeout, not a hang.
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const int port, FreeLoopbackPort());
  const Stopwatch start;
  auto rendezvous = Rendezvous::Tcp("127.0.0.1", port, 1, 2, absl::Seconds(2));
  EXPECT_FALSE(rendezvous.ok());
  EXPECT_LT(start.Elapsed(), absl::Seconds(15));
  EXPECT_THAT(rendezvous.status().message(),
              HasSubstr(absl::StrCat("joining the TCP store at 127.0.0.1:", port)));
}

std::function<std::optional<std::string>(const char*)> Env(
    std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(LaunchEnvironmentTest, ReadsTheProcessEnvironment) {
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29555", 1);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("LOCAL_RANK", "0", 1);
  auto env = LaunchEnvironmentFromProcess();
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->master_port, 29555);
  EXPECT_EQ(env->world_size, 1);
  unsetenv("WORLD_SIZE");
  EXPECT_THAT(LaunchEnvironmentFromProcess().status().message(),
              HasSubstr("WORLD_SIZE is not set"));
}

// A world of one from the environment: the store works (Set then Get), and a key nobody sets
// fails within the timeout, naming the key.
TEST(RendezvousTest, FromEnvironmentSetAndGet) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const int port, FreeLoopbackPort());
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  auto rendezvous = Rendezvous::FromEnvironment(absl::Seconds(2));
  ASSERT_TRUE(rendezvous.ok()) << rendezvous.status();
  EXPECT_EQ((*rendezvous)->rank(), 0);
  EXPECT_EQ((*rendezvous)->world_size(), 1);
  ASSERT_TRUE((*rendezvous)->Set("lockstep/test/key", std::string("va\0lue", 6)).ok());
  auto value = (*rendezvous)->Get("lockstep/test/key");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, std::string("va\0lue", 6));
  const Stopwatch start;
  auto missing = (*rendezvous)->Get("lockstep/test/never");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("lockstep/test/never"));
  EXPECT_LT(start.Elapsed(), 2 * (*rendezvous)->timeout() + absl::Seconds(5));
  // A key never set is a peer late, not the store lost (Note [Store lost]): the store still works.
  EXPECT_TRUE((*rendezvous)->Set("lockstep/test/after", "1").ok());
  EXPECT_TRUE((*rendezvous)->Check("lockstep/test/after").value_or(false));
}

// Note [Store lost]: rank 0 (which serves the store) gone, rank 1's next store call fails, and
// every call after it fails at once naming that first failure, instead of another timeout each.
TEST(RendezvousTest, AStoreLostOnceFailsEveryLaterCallAtOnce) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const int port, FreeLoopbackPort());
  const absl::Duration timeout = absl::Seconds(5);
  absl::StatusOr<std::shared_ptr<Rendezvous>> zero, one;
  std::thread serve([&] { zero = Rendezvous::Tcp("127.0.0.1", port, 0, 2, timeout); });
  one = Rendezvous::Tcp("127.0.0.1", port, 1, 2, timeout);
  serve.join();
  ASSERT_TRUE(zero.ok()) << zero.status();
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE((*one)->Set("lockstep/test/k", "v").ok());
  zero->reset();  // the store's server goes with rank 0
  absl::StatusOr<bool> first = (*one)->Check("lockstep/test/k");
  ASSERT_FALSE(first.ok());
  const Stopwatch start;
  const absl::Status set = (*one)->Set("lockstep/test/k", "w");
  const absl::StatusOr<std::string> get = (*one)->Get("lockstep/test/k");
  const absl::StatusOr<int64_t> beats = (*one)->Heartbeat(0);
  EXPECT_LT(start.Elapsed(), absl::Seconds(1));
  for (const absl::Status& s : {set, get.status(), beats.status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(s.message(), AllOf(HasSubstr("the rendezvous store was lost earlier"),
                                   HasSubstr(std::string(first.status().message()))));
  }
}

// A peer at MASTER_PORT that is not a working c10d store, on 127.0.0.1 in a thread of the test:
//   kSilent:  accepts every connection and never sends a byte;
//   kGarbage: accepts and sends what no store sends: a length prefix of 2^64 - 1, then noise;
//   kStalls:  forwards every connection to a real store at `upstream`, but passes back only the
//             first 8 bytes the store answers (one reply), then nothing: a store that answered
//             once and then stopped (its process stopped, its host overloaded).
class HostilePeer {
 public:
  enum class Mode { kSilent, kGarbage, kStalls };

  static absl::StatusOr<std::unique_ptr<HostilePeer>> Start(Mode mode, int upstream = 0) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = 0;
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    socklen_t length = sizeof(address);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        listen(fd, 16) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      if (fd >= 0) close(fd);
      return absl::InternalError(absl::StrCat("hostile peer: ", std::strerror(errno)));
    }
    std::unique_ptr<HostilePeer> peer(new HostilePeer(mode, fd, ntohs(address.sin_port), upstream));
    peer->thread_ = std::thread([p = peer.get()] { p->Serve(); });
    return peer;
  }

  ~HostilePeer() {
    stop_ = true;
    thread_.join();
    close(listener_);
  }

  int port() const { return port_; }

 private:
  HostilePeer(Mode mode, int listener, int port, int upstream)
      : mode_(mode), listener_(listener), port_(port), upstream_(upstream) {}

  static int ConnectUpstream(int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  }

  void Serve() {
    // Each connection: the client's descriptor and, when stalling, the store's.
    std::vector<std::pair<int, int>> links;
    size_t replies_left = 8;
    while (!stop_) {
      std::vector<pollfd> fds = {{listener_, POLLIN, 0}};
      for (const auto& [client, store] : links) {
        fds.push_back({client, POLLIN, 0});
        fds.push_back({store, POLLIN, 0});
      }
      if (poll(fds.data(), fds.size(), 50) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int client = accept(listener_, nullptr, nullptr);
        if (client >= 0) {
          if (mode_ == Mode::kGarbage) {
            std::string noise(8, '\xff');  // a length prefix of 2^64 - 1
            for (int i = 0; i < 4096; ++i) noise.push_back(static_cast<char>(i * 37 + 11));
            (void)WriteAll(client, noise);
          }
          links.push_back({client, mode_ == Mode::kStalls ? ConnectUpstream(upstream_) : -1});
        }
      }
      for (size_t i = 0; i < links.size(); ++i) {
        char buffer[4096];
        if (fds[1 + 2 * i].revents & POLLIN) {  // the client sent: the store gets it (if any)
          const ssize_t n = read(links[i].first, buffer, sizeof(buffer));
          if (n > 0 && links[i].second >= 0) {
            (void)WriteAll(links[i].second, absl::string_view(buffer, n));
          }
        }
        if (links[i].second >= 0 && (fds[2 + 2 * i].revents & POLLIN)) {  // the store answered
          const ssize_t n = read(links[i].second, buffer, sizeof(buffer));
          const size_t passed = n > 0 ? std::min(replies_left, static_cast<size_t>(n)) : 0;
          (void)WriteAll(links[i].first, absl::string_view(buffer, passed));
          replies_left -= passed;
        }
      }
    }
    for (const auto& [client, store] : links) {
      close(client);
      if (store >= 0) close(store);
    }
  }

  const Mode mode_;
  const int listener_;
  const int port_;
  const int upstream_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Runs `body` in a forked child and returns its status. An abort, a crash or a hang past `bound`
// comes back as a status saying so ("... was killed by signal 6 (Aborted)"), so that the test
// observes it instead of losing its own process.
absl::Status InChild(absl::Duration bound, const std::function<absl::Status()>& body) {
  absl::StatusOr<Child> child = Child::Fork(ChildOptions::Reporting(), [&](int channel) {
    const absl::Status status = body();
    (void)WriteAll(channel, absl::StrCat(static_cast<int>(status.code()), " ", status.message()));
    return 0;
  });
  if (!child.ok()) return child.status();
  std::string report;
  const Stopwatch clock;
  bool open = true;
  while (open && clock.Elapsed() < bound) {
    absl::StatusOr<int> still_open = PollChannels(
        {&*child}, bound - clock.Elapsed(),
        [&](size_t, absl::string_view bytes) { report.append(bytes.data(), bytes.size()); });
    open = still_open.ok() && *still_open > 0;
  }
  if (open) {
    child->Signal(SIGKILL);
    child->Reap();
    return absl::InternalError(
        absl::StrCat("the child was still running after ", absl::FormatDuration(bound)));
  }
  child->Reap();
  const std::vector<std::string> parts = absl::StrSplit(report, absl::MaxSplits(' ', 1));
  int code = -1;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &code)) {
    return absl::InternalError(absl::StrCat("the child ", child->Describe(), " without a report"));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), parts[1]);
}

// Rank 1's rendezvous against `peer` in a child, with `timeout`: its status and how long it took.
absl::Status RankOneAgainst(int port, absl::Duration timeout, absl::Duration* took) {
  const Stopwatch clock;
  const absl::Status status = InChild(timeout + absl::Seconds(10), [&] {
    return Rendezvous::Tcp("127.0.0.1", port, 1, 2, timeout).status();
  });
  *took = clock.Elapsed();
  return status;
}

// Note [Bounded start-up]: a listener at MASTER_PORT that accepts and never answers fails the
// rendezvous within its timeout, naming the address and what was being waited for.
TEST(RendezvousTest, ASilentListenerFailsWithinTheTimeout) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto peer, HostilePeer::Start(HostilePeer::Mode::kSilent));
  const absl::Duration timeout = absl::Seconds(2);
  absl::Duration took;
  const absl::Status status = RankOneAgainst(peer->port(), timeout, &took);
  EXPECT_THAT(status.code(),
              AnyOf(absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kUnavailable))
      << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr(absl::StrCat("127.0.0.1:", peer->port())),
                                      HasSubstr("did not answer a store query within 2s")));
  EXPECT_LT(took, timeout + absl::Seconds(3));
}

// Note [Bounded start-up]: a store that answered once (the first query) and then stopped: the
// wait inside LibTorch's store calls is bounded too.
TEST(RendezvousTest, AStoreThatStopsAnsweringFailsWithinTheTimeout) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const int store_port, FreeLoopbackPort());
  const absl::Duration timeout = absl::Seconds(3);
  // Rank 0 serves a real store for a world of 3 whose rank 2 never comes.
  absl::StatusOr<std::shared_ptr<Rendezvous>> zero;
  std::thread serve([&] { zero = Rendezvous::Tcp("127.0.0.1", store_port, 0, 3, timeout); });
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto peer,
                                HostilePeer::Start(HostilePeer::Mode::kStalls, store_port));
  const Stopwatch clock;
  const absl::Status status = InChild(timeout + absl::Seconds(10), [&] {
    return Rendezvous::Tcp("127.0.0.1", peer->port(), 1, 3, timeout).status();
  });
  const absl::Duration took = clock.Elapsed();
  serve.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  // Given up by lockstep's own deadline, or by a receive timeout LibTorch set on its socket.
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(absl::StrCat("127.0.0.1:", peer->port())),
                    AnyOf(HasSubstr("did not answer within 3s"), HasSubstr("within 3s"))));
  EXPECT_LT(took, timeout + absl::Seconds(4));
}

// A listener at MASTER_PORT that answers with bytes no store sends (a length prefix of 2^64 - 1):
// an error naming the address, not an abort on one of LibTorch's threads.
TEST(RendezvousTest, AListenerAnsweringGarbageIsAnErrorNotAnAbort) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(auto peer, HostilePeer::Start(HostilePeer::Mode::kGarbage));
  absl::Duration took;
  const absl::Status status = RankOneAgainst(peer->port(), absl::Seconds(2), &took);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("127.0.0.1:", peer->port(),
                                                       " did not answer as a c10d store")))
      << status;
  EXPECT_LT(took, absl::Seconds(5));
}

// RANK=1 given to two processes over rank 0's TCP store (threads here, each with its own
// Rendezvous). The world is of 3 and rank 2 never comes, so that it cannot complete, and rank 0's
// store go away, before the second claim however late a loaded machine starts its thread: rank 0
// fails naming the rank and both claimants, and so does each claimant that reaches the store
// before rank 0 has left.
TEST(RendezvousTest, ARankGivenTwiceIsNamed) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const int port, FreeLoopbackPort());
  const absl::Duration timeout = absl::Seconds(3);
  std::vector<absl::Status> results(3);
  const Stopwatch clock;
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      results[i] = Rendezvous::Tcp("127.0.0.1", port, i == 0 ? 0 : 1, 3, timeout).status();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LT(clock.Elapsed(), timeout + absl::Seconds(3));
  int named = 0;
  for (int i = 0; i < 3; ++i) {
    if (results[i].ok()) continue;
    // A claimant whose next call to the store comes after rank 0 has named the duplicate and
    // left (the store lives in rank 0) cannot learn more than that the store is gone: it fails
    // naming the store, within the timeout. Rank 0 is always told.
    if (i != 0 && !absl::IsFailedPrecondition(results[i]) &&
        absl::StrContains(results[i].message(), absl::StrCat("127.0.0.1:", port))) {
      continue;
    }
    EXPECT_EQ(results[i].code(), absl::StatusCode::kFailedPrecondition) << results[i];
    EXPECT_THAT(results[i].message(),
                AllOf(HasSubstr("rank 1 is claimed by 2 processes"), HasSubstr(" pid ")))
        << "process " << i;
    ++named;
  }
  EXPECT_TRUE(absl::IsFailedPrecondition(results[0])) << "rank 0: " << results[0];
  EXPECT_GE(named, 1) << "nobody noticed rank 1 given twice";
}

// Two processes with RANK=1 while rank 0 has not come (the file store needs no server, so the
// order is certain): both learn of the duplicate at once, long before the timeout.
TEST(RendezvousTest, ARankGivenTwiceIsNamedToEveryProcessStillWaiting) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/twice_", getpid());
  const absl::Duration timeout = absl::Seconds(5);
  const Stopwatch clock;
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] { results[i] = Rendezvous::File(path, 1, 2, timeout).status(); });
  }
  for (std::thread& t : threads) t.join();
  unlink(path.c_str());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(results[i].code(), absl::StatusCode::kFailedPrecondition)
        << "process " << i << ": " << results[i];
    EXPECT_THAT(results[i].message(),
                AllOf(HasSubstr("rank 1 is claimed by 2 processes"), HasSubstr(" pid ")))
        << "process " << i;
  }
  EXPECT_LT(clock.Elapsed(), absl::Seconds(3));
}

// Note [Rank claims]: a second RANK=1 that comes after ranks 0 and 1 completed their rendezvous
// and made a world. It fails itself at once; the other two, whose heartbeats see its claim, fail
// their next collective naming the rank and both claimants instead of going on (and exiting 0).
TEST(RendezvousTest, ARankClaimedAfterTheRendezvousFailsTheOthersNextCollective) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/late_twice_", getpid());
  const absl::Duration timeout = absl::Seconds(10);
  std::vector<std::shared_ptr<Rendezvous>> rendezvous(2);
  std::vector<std::unique_ptr<GlooCommunicator>> worlds(2);
  std::vector<absl::Status> first(2), after(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::shared_ptr<Rendezvous>> r = Rendezvous::File(path, rank, 2, timeout);
      if (!r.ok()) {
        first[rank] = r.status();
        return;
      }
      rendezvous[rank] = *r;
      GlooCommunicator::Options options;
      options.timeout = timeout;
      options.hostname = "127.0.0.1";
      absl::StatusOr<std::unique_ptr<GlooCommunicator>> world =
          GlooCommunicator::Create(rendezvous[rank], options);
      if (!world.ok()) {
        first[rank] = world.status();
        return;
      }
      worlds[rank] = std::move(*world);
      at::Tensor t = at::ones({4});
      first[rank] = worlds[rank]->AllReduceSum(t);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank)
    ASSERT_TRUE(first[rank].ok()) << "rank " << rank << ": " << first[rank];
  const absl::Status late = Rendezvous::File(path, 1, 2, timeout).status();
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_THAT(late.message(), HasSubstr("rank 1 is claimed by 2 processes"));
  // A few heartbeats, for each process to have seen the claim.
  absl::SleepFor(4 * Rendezvous::kHeartbeatPeriod);
  threads.clear();
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      at::Tensor t = at::ones({4});
      after[rank] = worlds[rank]->AllReduceSum(t);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(after[rank].code(), absl::StatusCode::kFailedPrecondition)
        << "rank " << rank << ": " << after[rank];
    EXPECT_THAT(after[rank].message(),
                AllOf(HasSubstr("rank 1 is claimed by 2 processes"), HasSubstr(" pid ")))
        << "rank " << rank;
  }
  worlds.clear();
  rendezvous.clear();
  unlink(path.c_str());
}

TEST(LaunchEnvironmentTest, LocalRankMustBeBelowLocalWorldSize) {
  std::map<std::string, std::string> vars = {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"},
                                             {"RANK", "3"},        {"WORLD_SIZE", "4"},
                                             {"LOCAL_RANK", "2"},  {"LOCAL_WORLD_SIZE", "2"}};
  const absl::Status status = ParseLaunchEnvironment(Env(vars)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"));
  vars["LOCAL_RANK"] = "1";
  EXPECT_TRUE(ParseLaunchEnvironment(Env(vars)).ok());
  // Without LOCAL_WORLD_SIZE there is no limit to check against.
  vars.erase("LOCAL_WORLD_SIZE");
  vars["LOCAL_RANK"] = "7";
  EXPECT_TRUE(ParseLaunchEnvironment(Env(vars)).ok());
}

TEST(LaunchEnvironmentTest, ParsesTheTorchrunVariables) {
  auto env = ParseLaunchEnvironment(Env({{"MASTER_ADDR", "10.1.2.3"},
                                         {"MASTER_PORT", "29500"},
                                         {"RANK", "5"},
                                         {"WORLD_SIZE", "8"},
                                         {"LOCAL_RANK", "1"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->master_addr, "10.1.2.3");
  EXPECT_EQ(env->master_port, 29500);
  EXPECT_EQ(env->rank, 5);
  EXPECT_EQ(env->world_size, 8);
  EXPECT_EQ(env->local_rank, 1);
  // LOCAL_RANK is optional.
  auto no_local = ParseLaunchEnvironment(
      Env({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}, {"RANK", "0"}, {"WORLD_SIZE", "1"}}));
  ASSERT_TRUE(no_local.ok());
  EXPECT_EQ(no_local->local_rank, 0);
}

TEST(LaunchEnvironmentTest, BadValuesAreNamed) {
  const std::map<std::string, std::string> good = {
      {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}};
  auto with = [&](const std::string& k, const std::string& v) {
    auto vars = good;
    vars[k] = v;
    return ParseLaunchEnvironment(Env(vars)).status();
  };
  auto without = [&](const std::string& k) {
    auto vars = good;
    vars.erase(k);
    return ParseLaunchEnvironment(Env(vars)).status();
  };
  EXPECT_THAT(without("MASTER_ADDR").message(), HasSubstr("MASTER_ADDR is not set"));
  EXPECT_THAT(without("RANK").message(), HasSubstr("RANK is not set"));
  EXPECT_THAT(with("MASTER_PORT", "70000").message(),
              HasSubstr("MASTER_PORT=70000 is not an integer in [1, 65535]"));
  EXPECT_THAT(with("WORLD_SIZE", "0").message(), HasSubstr("WORLD_SIZE=0"));
  EXPECT_THAT(with("RANK", "2").message(), HasSubstr("RANK=2 is not below WORLD_SIZE=2"));
  EXPECT_THAT(with("RANK", "x").message(), HasSubstr("RANK=x"));
  EXPECT_EQ(with("LOCAL_RANK", "-1").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace collectives
}  // namespace lockstep
