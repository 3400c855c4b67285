// admission/internal/ledger_head.h  (private to admission/)
//
// Note [The ledger's head record]: SQLite applies whatever -wal file lies beside a database at
// the next open, and ends a WAL at its first damaged frame; neither is an error to SQLite. So a
// WAL left by another ledger (another DP rank's writer killed mid-run, a copied directory) or one
// flipped bit would make a ledger say, without complaint, less than it committed. The ledger
// therefore keeps what it has made durable outside SQLite, in `<ledger>-head`: the ledger's
// identity (a random id made at creation, also stored in the database's identity table and folded
// into the first event's chain, with the DP rank) and the seq and chain value of the last event
// of a commit that was fsynced. Every open reads the head first, then the database without
// writing to it (no checkpoint, on close either), and refuses as kDataLoss a database whose
// identity differs or that does not hold that event with that chain; only a verified ledger is
// ever written to. So a foreign, damaged or missing WAL is never consumed, and stays for
// inspection.
//
// The head is written after the fsync that made its commit durable, so it may lag behind the
// database (a crash in between), never run ahead of what survives a power loss. Commits that are
// not fsynced (LedgerOptions without fsync_at_commit) do not move it: what the ledger may lose to
// an OS crash it cannot claim to hold.
//
// Layout: two slots of kHeadSlotBytes, each a small text record (readable with `cat`) ending in
// a SHA-256 check line, with a generation number. An update writes the slot the newest one is
// not in, in place (one write and one fdatasync, no rename), so a torn update leaves the other,
// previous slot intact; a reader takes the intact slot of the highest generation.
//
// Thread-safety: the functions are stateless; a LedgerHeadWriter is used by one thread at a time.

#ifndef LOCKSTEP_ADMISSION_INTERNAL_LEDGER_HEAD_H_
#define LOCKSTEP_ADMISSION_INTERNAL_LEDGER_HEAD_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lockstep {
namespace admission {
namespace internal {

inline constexpr int kHeadSlotBytes = 512;

struct LedgerHead {
  // 32 lowercase hex digits, made at creation.
  std::string ledger_id;
  int dp_rank = 0;
  // The last event of the last durable commit (0 and the genesis chain before the first one).
  int64_t seq = 0;
  // Its chain value (32 raw bytes).
  std::string chain;
};

// `<ledger>-head`.
std::string HeadPath(const std::string& ledger);

// A new random ledger id.
std::string NewLedgerId();

// The chain value before a ledger's first event: bound to the ledger's identity, so that events
// of another ledger never verify in this one.
std::string GenesisChain(const std::string& ledger_id, int dp_rank);

// Reads `<ledger>-head`: the intact slot of the highest generation. kNotFound if it does not
// exist; kDataLoss naming it if it is not a head (another kind of file, another size, no intact
// slot, slots of two ledgers); other codes for I/O errors, with the OS reason.
absl::StatusOr<LedgerHead> ReadLedgerHead(const std::string& ledger);

// Writes a new `<ledger>-head` holding `head` in both slots, atomically and durably (a file
// beside it, fsynced and renamed over any previous one).
absl::Status CreateLedgerHead(const std::string& ledger, const LedgerHead& head);

// Updates a ledger's head in place (see the Note). Opened once per writer.
class LedgerHeadWriter {
 public:
  // Opens `<ledger>-head` for updates; its current generation is read from it.
  static absl::StatusOr<std::unique_ptr<LedgerHeadWriter>> Open(const std::string& ledger);
  ~LedgerHeadWriter();
  LedgerHeadWriter(const LedgerHeadWriter&) = delete;
  LedgerHeadWriter& operator=(const LedgerHeadWriter&) = delete;

  // Writes `head` into the older slot and fdatasyncs it. Errors name the file and the OS reason.
  absl::Status Write(const LedgerHead& head);

 private:
  LedgerHeadWriter(std::string path, int fd, uint64_t generation)
      : path_(std::move(path)), fd_(fd), generation_(generation) {}

  std::string path_;
  int fd_;
  uint64_t generation_;  // of the newest slot
};

// Test seam for the crash harness: called with "head write" and "head sync" before each of
// LedgerHeadWriter's I/O steps (nullptr: none).
void SetLedgerHeadIoHookForTesting(void (*hook)(const char* step));

}  // namespace internal
}  // namespace admission
}  // namespace lockstep

#endif  // LOCKSTEP_ADMISSION_INTERNAL_LEDGER_HEAD_H_
