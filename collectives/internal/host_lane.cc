#include "collectives/internal/host_lane.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"

namespace lockstep {
namespace collectives {
namespace internal {
namespace {

// Segment layout: a header, then one control block per member, then one data slot per member.
// Each control block has cache lines of its own, written only by its member.
constexpr uint64_t kMagic = 0x6c6f636b73746570;  // "lockstep"
constexpr size_t kHeaderBytes = 128;
constexpr size_t kControlBytes = 128;

struct Header {
  uint64_t magic;
  uint64_t token;  // random, published with the name: proves the mapping is the one created
  int64_t size;
  std::atomic<int64_t> poisoned_by;  // 1 + the rank of a member that gave up, or 0
  // Note [Lane wake-ups]: every change a waiter may wait for (a member arriving or finishing a
  // round, a member giving up) adds 1 to `wakeups` and, when someone sleeps, wakes every futex
  // waiter on it. A waiter counts itself in `sleepers`, then reads `wakeups`, then checks
  // again, then sleeps only while `wakeups` still has the value it read: with sequentially
  // consistent operations on both sides, either the waker sees the sleeper or the sleeper sees
  // the change, so no wake-up is lost.
  std::atomic<uint32_t> wakeups;
  std::atomic<uint32_t> sleepers;
};
static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free,
              "a futex word");
static_assert(sizeof(Header) <= kHeaderBytes, "header");

struct Control {
  std::atomic<uint64_t> arrived;  // the last round this member has called (its slot written)
  std::atomic<uint64_t> done;     // the last round this member has finished
  uint32_t kind;                  // the collective of round `arrived`: kind and root
  int64_t bytes;                  // and its size
  std::atomic<uint64_t> nonce;    // Note [Proof of sharing]
};
static_assert(sizeof(Control) <= kControlBytes, "control block");

// Collective kinds, combined with the root in Round's `kind`.
constexpr uint32_t kBroadcast = 1u << 24;
constexpr uint32_t kAllGather = 2u << 24;
constexpr uint32_t kElsewhere = 3u << 24;

std::string DescribeKind(uint32_t kind, int64_t bytes) {
  if ((kind & 0xff000000u) == kBroadcast) {
    return absl::StrCat("broadcast of ", bytes, " bytes from rank ", kind & 0xffffffu);
  }
  if ((kind & 0xff000000u) == kAllGather) {
    return absl::StrCat("all-gather of ", bytes, " bytes per member (tag ", kind & 0xffffffu, ")");
  }
  if ((kind & 0xff000000u) == kElsewhere) {
    return absl::StrCat("a collective of ", bytes,
                        " bytes per member through the group, not the host lane (tag ",
                        kind & 0xffffffu, ")");
  }
  return absl::StrCat("unknown collective ", kind);
}

size_t SegmentBytes(int size) {
  return kHeaderBytes + static_cast<size_t>(size) * (kControlBytes + HostLane::kMaxBytes);
}

Header& HeaderOf(void* mapping) { return *static_cast<Header*>(mapping); }
Control& ControlOf(void* mapping, int rank) {
  return *reinterpret_cast<Control*>(static_cast<char*>(mapping) + kHeaderBytes +
                                     static_cast<size_t>(rank) * kControlBytes);
}
char* SlotOf(void* mapping, int size, int rank) {
  return static_cast<char*>(mapping) + kHeaderBytes + static_cast<size_t>(size) * kControlBytes +
         static_cast<size_t>(rank) * HostLane::kMaxBytes;
}

std::string ReadFirstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string NamespaceOf(const char* link) {
  char target[256];
  const ssize_t n = readlink(link, target, sizeof(target) - 1);
  return n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string();
}

// Note [Proof of sharing]
// Identifiers do not prove that two processes share memory: hosts made of namespaces share a
// kernel and so a boot id, namespace inode numbers of different machines' initial namespaces are
// equal, and a segment name can be forged or stale (a /dev/shm of another mount namespace holding
// a copy with the right header and token). So the identity below only rules out attempts that
// cannot work; what decides is the mapping itself: every member that mapped the segment writes a
// random nonce into its own control block and publishes it in the store, and then checks that
// its mapping holds every member's published nonce. Only if every member saw every nonce — so
// all of them map the same memory — is the lane used; otherwise every member goes without.
void (*g_before_attach_for_testing)(const std::string& name) = nullptr;

// Who may share memory with whom: same machine boot, same IPC namespace (shm_open's), same PID
// namespace (so a peer's pid can be checked), same user (the segment is 0600). A pre-filter only
// (Note [Proof of sharing]).
std::string HostIdentity() {
  const std::string boot = ReadFirstLine("/proc/sys/kernel/random/boot_id");
  const std::string ipc = NamespaceOf("/proc/self/ns/ipc");
  const std::string pid = NamespaceOf("/proc/self/ns/pid");
  if (boot.empty() || ipc.empty() || pid.empty()) return "";
  return absl::StrCat(boot, "|", ipc, "|", pid, "|", getuid());
}

// Whether process `pid` has exited: gone, or a zombie its parent has not reaped yet.
bool HasExited(int64_t pid) {
  if (kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  const std::string stat = ReadFirstLine(absl::StrCat("/proc/", pid, "/stat").c_str());
  const size_t name_end = stat.rfind(')');
  if (name_end == std::string::npos || name_end + 2 >= stat.size()) return false;
  const char state = stat[name_end + 2];
  return state == 'Z' || state == 'X';
}

// FUTEX_WAIT and FUTEX_WAKE on a word of the shared segment (not FUTEX_PRIVATE_FLAG: the waiters
// are other processes). A wait returns on a wake-up, when the word no longer holds `expected`,
// on a signal, or after `timeout`; callers re-check their condition either way.
void FutexWait(std::atomic<uint32_t>& word, uint32_t expected, absl::Duration timeout) {
  const struct timespec ts = absl::ToTimespec(timeout);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Whether this process may run on at least `members` CPUs: then a waiter can spin a little
// without taking the CPU the member it waits for needs.
bool EnoughCpusToSpin(int members) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return false;
  return CPU_COUNT(&set) >= members;
}

void* MapSegment(int fd, size_t bytes) {
  void* mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return mapping == MAP_FAILED ? nullptr : mapping;
}

}  // namespace

void SetBeforeAttachForTesting(void (*hook)(const std::string& name)) {
  g_before_attach_for_testing = hook;
}

namespace {

// Step 1 of Connect: every member publishes its pid and where it runs (HostIdentity), and reads
// every member's pid into `pids`. Whether every member runs where this one does.
absl::StatusOr<bool> SameHostAsEveryone(Rendezvous& rendezvous, const std::string& key, int rank,
                                        int size, std::vector<int64_t>& pids) {
  const std::string identity = HostIdentity();
  LOCKSTEP_RETURN_IF_ERROR(
      rendezvous.Set(absl::StrCat(key, "/member/", rank), absl::StrCat(getpid(), " ", identity)));
  bool shared = !identity.empty();
  for (int r = 0; r < size; ++r) {
    LOCKSTEP_ASSIGN_OR_RETURN(const std::string member,
                              rendezvous.Get(absl::StrCat(key, "/member/", r)));
    const std::vector<std::string> parts = absl::StrSplit(member, absl::MaxSplits(' ', 1));
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &pids[r]) || parts[1] != identity) {
      shared = false;
    }
  }
  return shared;
}

// The segment as a member holds it during setup: its mapping (nullptr: none) and the name and
// token it was published under.
struct Segment {
  void* mapping = nullptr;
  std::string name;
  uint64_t token = 0;
};

// The first member's segment of `bytes` bytes for `size` members, created under a fresh random
// name and token and initialized; its mapping is nullptr where that failed.
Segment CreateSegment(int size, size_t bytes) {
  Segment segment;
  std::random_device entropy;
  segment.token = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
  segment.name = absl::StrCat("/lockstep-", getpid(), "-", segment.token);
  const int fd = shm_open(segment.name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd >= 0) {
    if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) segment.mapping = MapSegment(fd, bytes);
    close(fd);
    if (segment.mapping == nullptr) shm_unlink(segment.name.c_str());
  }
  if (segment.mapping != nullptr) {
    // A fresh segment reads as zeros: every counter at round 0, nobody poisoned.
    Header& header = HeaderOf(segment.mapping);
    header.magic = kMagic;
    header.token = segment.token;
    header.size = size;
    new (&header.poisoned_by) std::atomic<int64_t>(0);
    new (&header.wakeups) std::atomic<uint32_t>(0);
    new (&header.sleepers) std::atomic<uint32_t>(0);
    for (int r = 0; r < size; ++r) {
      Control& control = ControlOf(segment.mapping, r);
      new (&control.arrived) std::atomic<uint64_t>(0);
      new (&control.done) std::atomic<uint64_t>(0);
      new (&control.nonce) std::atomic<uint64_t>(0);
    }
    std::atomic_thread_fence(std::memory_order_release);
  }
  return segment;
}

// Another member's view of the segment the first one published as `published` ("<name> <token>",
// or "none"): mapped only if it is `bytes` long and its header names `size` members and the token.
Segment AttachSegment(const std::string& published, int size, size_t bytes) {
  Segment segment;
  const std::vector<std::string> parts = absl::StrSplit(published, ' ');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &segment.token)) return segment;
  segment.name = parts[0];
  if (g_before_attach_for_testing != nullptr) g_before_attach_for_testing(segment.name);
  const int fd = shm_open(segment.name.c_str(), O_RDWR, 0);
  if (fd >= 0) {
    struct stat info;
    if (fstat(fd, &info) == 0 && static_cast<size_t>(info.st_size) == bytes) {
      segment.mapping = MapSegment(fd, bytes);
    }
    close(fd);
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  void* mapping = segment.mapping;
  if (mapping != nullptr &&
      (HeaderOf(mapping).magic != kMagic || HeaderOf(mapping).token != segment.token ||
       HeaderOf(mapping).size != size)) {
    munmap(mapping, bytes);  // a segment of the same name that is not ours
    segment.mapping = nullptr;
  }
  return segment;
}

// Step 2 of Connect: the first member creates the segment and publishes its name and token
// ("none": no lane); the others read them and map it.
absl::StatusOr<Segment> ShareSegment(Rendezvous& rendezvous, const std::string& key, int rank,
                                     int size, size_t bytes) {
  if (rank != 0) {
    LOCKSTEP_ASSIGN_OR_RETURN(const std::string published, rendezvous.Get(key + "/segment"));
    return AttachSegment(published, size, bytes);
  }
  Segment segment = CreateSegment(size, bytes);
  // A failed publication returns as it was: the segment stays mapped and named.
  LOCKSTEP_RETURN_IF_ERROR(rendezvous.Set(
      key + "/segment",
      segment.mapping != nullptr ? absl::StrCat(segment.name, " ", segment.token) : "none"));
  return segment;
}

// Step 3 of Connect: a member that mapped the segment leaves a random nonce in its control block;
// every member publishes its nonce ("0": not mapped) and reads every member's. Whether this
// member's mapping holds every published nonce (Note [Proof of sharing]).
absl::StatusOr<bool> SeesEveryNonce(Rendezvous& rendezvous, const std::string& key, int rank,
                                    int size, void* mapping) {
  uint64_t nonce = 0;
  if (mapping != nullptr) {
    std::random_device entropy;
    nonce = ((static_cast<uint64_t>(entropy()) << 32) ^ entropy()) | 1;  // never 0
    ControlOf(mapping, rank).nonce.store(nonce, std::memory_order_release);
  }
  LOCKSTEP_RETURN_IF_ERROR(
      rendezvous.Set(absl::StrCat(key, "/attached/", rank), absl::StrCat(nonce)));
  bool sees_everyone = mapping != nullptr;
  for (int r = 0; r < size; ++r) {
    LOCKSTEP_ASSIGN_OR_RETURN(const std::string attached,
                              rendezvous.Get(absl::StrCat(key, "/attached/", r)));
    uint64_t published = 0;
    sees_everyone = sees_everyone && absl::SimpleAtoi(attached, &published) && published != 0 &&
                    ControlOf(mapping, r).nonce.load(std::memory_order_acquire) == published;
  }
  return sees_everyone;
}

// Step 4 of Connect: every member publishes whether it sees every nonce and reads every
// member's verdict. Whether all of them do.
absl::StatusOr<bool> EveryoneSeesEveryone(Rendezvous& rendezvous, const std::string& key, int rank,
                                          int size, bool sees_everyone) {
  LOCKSTEP_RETURN_IF_ERROR(
      rendezvous.Set(absl::StrCat(key, "/verified/", rank), sees_everyone ? "1" : "0"));
  bool everyone = sees_everyone;
  for (int r = 0; r < size; ++r) {
    LOCKSTEP_ASSIGN_OR_RETURN(const std::string verified,
                              rendezvous.Get(absl::StrCat(key, "/verified/", r)));
    everyone = everyone && verified == "1";
  }
  return everyone;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostLane>> HostLane::Connect(Rendezvous& rendezvous,
                                                            const std::string& store_key, int rank,
                                                            int size, absl::Duration timeout) {
  const std::string key = store_key + "/host-lane";
  const std::string what = absl::StrCat("setting up the host lane of ", store_key);
  if (size < 2 || rank < 0 || rank >= size) return std::unique_ptr<HostLane>();
  // 1. Every member publishes where it runs and its pid; all compare.
  std::vector<int64_t> pids(size, 0);
  absl::StatusOr<bool> shared = SameHostAsEveryone(rendezvous, key, rank, size, pids);
  if (!shared.ok()) return Annotate(shared.status(), what);
  if (!*shared) return std::unique_ptr<HostLane>();
  // 2. The first member creates the segment and publishes its name and token; the others map it.
  const size_t bytes = SegmentBytes(size);
  absl::StatusOr<Segment> segment = ShareSegment(rendezvous, key, rank, size, bytes);
  if (!segment.ok()) return Annotate(segment.status(), what);
  void* const mapping = segment->mapping;
  // 3. Every member that mapped it leaves its nonce there and publishes it.
  absl::StatusOr<bool> sees_everyone = SeesEveryNonce(rendezvous, key, rank, size, mapping);
  if (!sees_everyone.ok()) {
    if (mapping != nullptr) munmap(mapping, bytes);
    if (rank == 0 && !segment->name.empty()) shm_unlink(segment->name.c_str());
    return Annotate(sees_everyone.status(), what);
  }
  // 4. The name can go once every member has had its chance to map it; each member says whether
  // its mapping holds every published nonce (Note [Proof of sharing]).
  if (rank == 0 && !segment->name.empty()) shm_unlink(segment->name.c_str());
  absl::StatusOr<bool> everyone = EveryoneSeesEveryone(rendezvous, key, rank, size, *sees_everyone);
  if (!everyone.ok() || !*everyone) {
    if (mapping != nullptr) munmap(mapping, bytes);
    if (!everyone.ok()) return Annotate(everyone.status(), what);
    return std::unique_ptr<HostLane>();
  }
  return std::unique_ptr<HostLane>(
      new HostLane(mapping, bytes, rank, size, timeout, std::move(pids), EnoughCpusToSpin(size)));
}

HostLane::HostLane(void* mapping, size_t mapping_bytes, int rank, int size, absl::Duration timeout,
                   std::vector<int64_t> pids, bool spins)
    : mapping_(mapping),
      mapping_bytes_(mapping_bytes),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      pids_(std::move(pids)),
      spins_(spins) {}

HostLane::~HostLane() { munmap(mapping_, mapping_bytes_); }

absl::Status HostLane::Fail(absl::Status status) {
  broken_ = status;
  int64_t none = 0;
  HeaderOf(mapping_).poisoned_by.compare_exchange_strong(none, rank_ + 1);
  WakeWaiters();
  return status;
}

void HostLane::WakeWaiters() {
  // Note [Lane wake-ups].
  Header& header = HeaderOf(mapping_);
  header.wakeups.fetch_add(1, std::memory_order_seq_cst);
  if (header.sleepers.load(std::memory_order_seq_cst) > 0) FutexWakeAll(header.wakeups);
}

absl::Status HostLane::WaitFor(int field, uint64_t round, int first, int last,
                               const std::string& what) {
  auto reached = [&](int r) {
    const Control& control = ControlOf(mapping_, r);
    return (field == 0 ? control.arrived : control.done).load(std::memory_order_acquire) >= round;
  };
  int waiting_for = first;
  auto everyone = [&] {
    while (waiting_for <= last && reached(waiting_for)) ++waiting_for;
    return waiting_for > last;
  };
  if (everyone()) return absl::OkStatus();
  // A collective in step completes in microseconds: spin that long where the members have a
  // CPU each, then sleep on the segment's futex (Note [Lane wake-ups]), waking at least every
  // millisecond to check the clock and whether the awaited member still exists.
  Header& header = HeaderOf(mapping_);
  const absl::Time start = absl::Now();
  const absl::Time spin_until = start + (spins_ ? absl::Microseconds(50) : absl::ZeroDuration());
  absl::Time next_liveness_check = start + absl::Milliseconds(2);
  for (uint64_t poll = 0;; ++poll) {
    if (everyone()) return absl::OkStatus();
    if (poll % 64 != 63) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      if (spins_) continue;
    }
    const absl::Time now = absl::Now();
    if (now >= spin_until) {
      header.sleepers.fetch_add(1, std::memory_order_seq_cst);
      const uint32_t seen = header.wakeups.load(std::memory_order_seq_cst);
      if (!everyone() && header.poisoned_by.load(std::memory_order_acquire) == 0) {
        FutexWait(header.wakeups, seen, absl::Milliseconds(1));
      }
      header.sleepers.fetch_sub(1, std::memory_order_seq_cst);
      if (everyone()) return absl::OkStatus();
    }
    const int64_t poisoned = header.poisoned_by.load(std::memory_order_acquire);
    if (poisoned != 0 && poisoned != rank_ + 1) {
      return Fail(absl::UnavailableError(
          absl::StrCat(what, ": rank ", poisoned - 1, " of the group gave up after an error")));
    }
    const absl::Time checked = absl::Now();
    if (checked - start >= timeout_) {
      return Fail(absl::DeadlineExceededError(
          absl::StrCat(what, " timed out after ", absl::FormatDuration(timeout_),
                       " waiting for rank ", waiting_for, "; a peer did not arrive")));
    }
    if (checked >= next_liveness_check) {
      next_liveness_check = checked + absl::Milliseconds(10);
      if (HasExited(pids_[waiting_for])) {
        return Fail(absl::UnavailableError(absl::StrCat(what, ": rank ", waiting_for, " (pid ",
                                                        pids_[waiting_for], ") has exited")));
      }
    }
  }
}

absl::Status HostLane::Round(uint32_t kind, const void* input, bool writes, int first_source,
                             int last_source, bool checks_all, int64_t bytes, void* output,
                             const std::string& what) {
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the host lane failed earlier: ", broken_.message()));
  }
  // A round that moves nothing (Announce) only compares its size.
  const bool moves = writes || first_source <= last_source;
  if (bytes < 0 || (moves && bytes > kMaxBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", bytes, " bytes per member; the host lane carries 0 to ", kMaxBytes));
  }
  const uint64_t round = ++round_;
  // Nobody may still be reading the previous round's slots (nor checking its calls).
  LOCKSTEP_RETURN_IF_ERROR(WaitFor(/*field=*/1, round - 1, 0, size_ - 1, what));
  Control& mine = ControlOf(mapping_, rank_);
  if (writes && bytes > 0) std::memcpy(SlotOf(mapping_, size_, rank_), input, bytes);
  mine.kind = kind;
  mine.bytes = bytes;
  mine.arrived.store(round, std::memory_order_release);
  WakeWaiters();
  // A receiver waits for (and checks the call of) the members it reads from; a broadcast's root
  // reads from nobody but waits for and checks every member, so that members that disagree on
  // the root (each its own, say) are refused rather than each keeping its own bytes.
  const int first_checked = checks_all ? 0 : first_source;
  const int last_checked = checks_all ? size_ - 1 : last_source;
  LOCKSTEP_RETURN_IF_ERROR(WaitFor(/*field=*/0, round, first_checked, last_checked, what));
  for (int r = first_checked; r <= last_checked; ++r) {
    const Control& theirs = ControlOf(mapping_, r);
    if (theirs.kind != kind || theirs.bytes != bytes) {
      return Fail(absl::FailedPreconditionError(absl::StrCat(
          what, ": members called different collectives (this member: ", DescribeKind(kind, bytes),
          "; rank ", r, ": ", DescribeKind(theirs.kind, theirs.bytes), ")")));
    }
  }
  for (int r = first_source; r <= last_source && bytes > 0; ++r) {
    char* into = static_cast<char*>(output) + static_cast<size_t>(r - first_source) * bytes;
    const void* from = r == rank_ && writes ? input : SlotOf(mapping_, size_, r);
    if (into != from) std::memcpy(into, from, bytes);
  }
  mine.done.store(round, std::memory_order_release);
  WakeWaiters();
  return absl::OkStatus();
}

absl::Status HostLane::Broadcast(void* data, int64_t bytes, int root, const std::string& what) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": root ", root, " is outside [0, ", size_, ")"));
  }
  const bool is_root = root == rank_;
  // The root only writes; the others read the root's slot into `data`.
  return Round(kBroadcast | static_cast<uint32_t>(root), data, is_root, is_root ? 1 : root,
               is_root ? 0 : root, /*checks_all=*/is_root, bytes, data, what);
}

absl::Status HostLane::AllGather(const void* input, int64_t bytes, void* output,
                                 const std::string& what, uint32_t tag) {
  if (tag > kMaxTag) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": tag ", tag, " is over the host lane's ", kMaxTag));
  }
  return Round(kAllGather | tag, input, /*writes=*/true, 0, size_ - 1, /*checks_all=*/true, bytes,
               output, what);
}

absl::Status HostLane::Announce(int64_t bytes, const std::string& what, uint32_t tag) {
  if (tag > kMaxTag) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": tag ", tag, " is over the host lane's ", kMaxTag));
  }
  return Round(kElsewhere | tag, nullptr, /*writes=*/false, 0, -1, /*checks_all=*/true, bytes,
               nullptr, what);
}

}  // namespace internal
}  // namespace collectives
}  // namespace lockstep
