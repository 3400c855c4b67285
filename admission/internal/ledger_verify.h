// admission/internal/ledger_verify.h  (private to admission/)
//
// Reading a ledger back (ledger.h): every table of the file, checked against the ledger's
// invariants — this schema version, SQLite's integrity check, every event's chain, steps planned
// before anything else happens to them, nothing after a commit, exactly-once contributions, and
// derived tables that hold exactly what the events imply — and the replay built from them. Any
// violation is kDataLoss naming the path and what is wrong.
//
// Thread-safety: stateless.

#ifndef LOCKSTEP_ADMISSION_INTERNAL_LEDGER_VERIFY_H_
#define LOCKSTEP_ADMISSION_INTERNAL_LEDGER_VERIFY_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "admission/internal/sqlite.h"
#include "admission/ledger.h"

namespace lockstep {
namespace admission {
namespace internal {

// Sorted, merged copy of `ranges`.
std::vector<TokenRange> Merged(std::vector<TokenRange> ranges);

// Planned ranges (one per sequence: [0, num_tokens)) minus the completed (merged, disjoint).
std::vector<TokenRange> Missing(const std::map<int32_t, int64_t>& planned,
                                const std::vector<TokenRange>& completed);

// A verified ledger: its identity, its replay, and where a writer goes on (the last chain value,
// the next seq).
struct Verified {
  std::string ledger_id;
  int dp_rank = 0;
  LedgerReplay replay;
  std::string chain;
  int64_t next_seq = 1;
  // The chain value after event `head_seq` (the genesis chain for 0), or empty if the ledger does
  // not reach it: what the head is checked against.
  std::string head_chain;
};

// Reads every table of `db`, checks the ledger's invariants (this schema, exactly; one identity;
// every event of its DP rank and chained from its genesis) and builds its replay.
absl::StatusOr<Verified> LoadAndVerify(SqliteDb& db, int64_t head_seq);

}  // namespace internal
}  // namespace admission
}  // namespace lockstep

#endif  // LOCKSTEP_ADMISSION_INTERNAL_LEDGER_VERIFY_H_
