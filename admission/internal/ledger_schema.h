// admission/internal/ledger_schema.h  (private to admission/)
//
// The recovery ledger's file format (ledger.h): the SQLite schema with its exactly-once triggers,
// the identifiers that mark a file as a ledger of this version, the event kinds' names, the text
// form of token ranges, the SHA-256 chain every event row carries, and the atomic creation of an
// empty ledger.
//
// Thread-safety: stateless.

#ifndef LOCKSTEP_ADMISSION_INTERNAL_LEDGER_SCHEMA_H_
#define LOCKSTEP_ADMISSION_INTERNAL_LEDGER_SCHEMA_H_

#include <cstdint>
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

// "LkSt" in the database header, so that another SQLite file is not mistaken for a ledger.
inline constexpr int64_t kApplicationId = 0x4C6B5374;
// Version 2: a ledger knows its identity (table identity; Note [The ledger's head record]).
inline constexpr int64_t kSchemaVersion = 2;
inline constexpr int kNumKinds = 8;

// The kind named `name` (the schema's kind column); false for an unknown name.
bool ParseKind(absl::string_view name, LedgerEventKind* kind);

// The ranges of a ranges column ("batch_index:begin-end;..."); false for malformed text.
bool ParseRanges(absl::string_view text, std::vector<TokenRange>* ranges);

// "sequence 3 tokens [0, 8)", for messages.
std::string RangeText(const TokenRange& r);

// The chain value of event `e` (its ranges column `ranges`) after the chain value `previous`.
std::string ChainOf(absl::string_view previous, const LedgerEvent& e, absl::string_view ranges);

// kDataLoss naming the first difference unless `db`'s schema (tables, indexes, triggers, with
// their statements) is exactly this build's: a ledger whose triggers were edited would accept
// what exactly-once forbids.
absl::Status VerifySchema(SqliteDb& db);

// Creates an empty ledger of DP rank `dp_rank` at `path` atomically and returns its new identity:
// the schema and identity are committed to a temporary file beside it (a rollback journal, so the
// file holds everything once committed), read back and verified, fsynced and linked into place
// (never replacing a ledger another writer created meanwhile: kFailedPrecondition), the directory
// is fsynced, and then the head is written. A crash or a full disk leaves either no ledger or a
// complete empty one.
absl::StatusOr<std::string> CreateLedgerFile(const std::string& path, int dp_rank);

}  // namespace internal
}  // namespace admission
}  // namespace lockstep

#endif  // LOCKSTEP_ADMISSION_INTERNAL_LEDGER_SCHEMA_H_
