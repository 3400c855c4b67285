// admission/ledger_open.cc: opening a ledger (ledger.h): the checks of its path, its
// verification against its head record (Note [The ledger's head record]), OpenWriter and Replay.
// The writes are ledger.cc's.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "admission/internal/ledger_head.h"
#include "admission/internal/ledger_schema.h"
#include "admission/internal/ledger_verify.h"
#include "admission/internal/sqlite.h"
#include "admission/ledger.h"
#include "base/status_macros.h"

namespace lockstep {
namespace admission {
namespace {

using internal::CreateLedgerFile;
using internal::CreateLedgerHead;
using internal::GenesisChain;
using internal::LedgerHead;
using internal::LedgerHeadWriter;
using internal::LoadAndVerify;
using internal::ReadLedgerHead;
using internal::SqliteDb;
using internal::Verified;

// What a ledger path must be before SQLite sees it: a regular file (kNotFound if there is none).
absl::Status CheckLedgerPath(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    const int error = errno;
    if (error == ENOENT)
      return absl::NotFoundError(absl::StrCat("ledger ", path, " does not exist"));
    if (error == ELOOP || error == ENAMETOOLONG || error == ENOTDIR) {
      return absl::InvalidArgumentError(
          absl::StrCat("ledger ", path, " cannot be a ledger: ", std::strerror(error)));
    }
    return absl::InternalError(absl::StrCat("ledger ", path, ": ", std::strerror(error)));
  }
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ledger ", path, " is ", S_ISDIR(info.st_mode) ? "a directory" : "not a regular file",
        ", not a ledger file"));
  }
  return absl::OkStatus();
}

// For a ledger whose database does not exist: kDataLoss if its head says something was committed
// (or is damaged, so cannot say), since the database's history is then lost.
absl::Status CheckNoLostHistory(const std::string& path) {
  absl::StatusOr<LedgerHead> head = ReadLedgerHead(path);
  if (head.ok() && head->seq > 0) {
    return absl::DataLossError(absl::StrCat("ledger ", path, " is missing, but its head (",
                                            internal::HeadPath(path), ") says events up to ",
                                            head->seq, " were committed durably"));
  }
  if (absl::IsDataLoss(head.status())) {
    return Annotate(head.status(), absl::StrCat("ledger ", path, " is missing"));
  }
  return absl::OkStatus();
}

// A ledger opened and verified against its head (Note [The ledger's head record]). `head` is
// empty for a ledger with no events and no head (a creation cut short before its head).
struct Opened {
  std::unique_ptr<SqliteDb> db;
  Verified verified;
  std::optional<LedgerHead> head;
};

absl::StatusOr<Opened> OpenVerified(const std::string& path) {
  LOCKSTEP_RETURN_IF_ERROR(CheckLedgerPath(path));
  // The head first: the database read after it holds at least what it names.
  absl::StatusOr<LedgerHead> head = ReadLedgerHead(path);
  if (!head.ok() && !absl::IsNotFound(head.status())) return head.status();
  Opened opened;
  LOCKSTEP_ASSIGN_OR_RETURN(opened.db, SqliteDb::Open(path, /*create=*/false));
  LOCKSTEP_ASSIGN_OR_RETURN(opened.verified, LoadAndVerify(*opened.db, head.ok() ? head->seq : -1));
  const Verified& v = opened.verified;
  const int64_t last = v.next_seq - 1;
  if (!head.ok()) {
    if (last > 0) {
      return absl::DataLossError(absl::StrCat(
          "ledger ", path, " holds ", last, " events but has no head record (",
          internal::HeadPath(path),
          "): it was removed, or the ledger copied without it, so what was committed cannot be "
          "checked"));
    }
    return opened;
  }
  const std::string wal = absl::StrCat(path, "-wal");
  if (head->ledger_id != v.ledger_id || head->dp_rank != v.dp_rank) {
    return absl::DataLossError(
        absl::StrCat("ledger ", path, " holds ledger ", v.ledger_id, " of DP rank ", v.dp_rank,
                     ", but its head names ledger ", head->ledger_id, " of DP rank ", head->dp_rank,
                     ": the database, or its WAL (", wal, "), is another ledger's; left as found"));
  }
  if (v.head_chain.empty()) {
    return absl::DataLossError(absl::StrCat("ledger ", path, " ends at event ", last,
                                            ", but its head says events up to ", head->seq,
                                            " were committed durably: its WAL (", wal,
                                            ") is damaged, missing or another's; left as found"));
  }
  if (v.head_chain != head->chain) {
    return absl::DataLossError(absl::StrCat(
        "ledger ", path, ": event ", head->seq,
        " is not the one its head recorded (another chain value): the database or its WAL (", wal,
        ") was replaced; left as found"));
  }
  opened.head = *std::move(head);
  return opened;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Ledger>> Ledger::OpenWriter(const std::string& path,
                                                           const LedgerOptions& options) {
  if (options.dp_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ledger ", path, ": dp_rank ", options.dp_rank, " is negative"));
  }
  if (absl::Status exists = CheckLedgerPath(path); absl::IsNotFound(exists)) {
    LOCKSTEP_RETURN_IF_ERROR(CheckNoLostHistory(path));
    absl::StatusOr<std::string> created = CreateLedgerFile(path, options.dp_rank);
    if (!created.ok() && !absl::IsFailedPrecondition(created.status())) return created.status();
  } else if (!exists.ok()) {
    return exists;
  }
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("opening ledger ", path, ": ", strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int saved = errno;
    close(fd);
    if (saved == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("ledger ", path, " already has a writer; a ledger has one writer"));
    }
    return absl::InternalError(absl::StrCat("locking ledger ", path, ": ", strerror(saved)));
  }
  absl::StatusOr<std::unique_ptr<Ledger>> ledger =
      [&]() -> absl::StatusOr<std::unique_ptr<Ledger>> {
    LOCKSTEP_ASSIGN_OR_RETURN(Opened opened, OpenVerified(path));
    Verified& v = opened.verified;
    if (v.dp_rank != options.dp_rank) {
      return absl::FailedPreconditionError(absl::StrCat("ledger ", path, " is DP rank ", v.dp_rank,
                                                        "'s; this writer is DP rank ",
                                                        options.dp_rank));
    }
    if (!opened.head.has_value()) {
      LedgerHead head;
      head.ledger_id = v.ledger_id;
      head.dp_rank = v.dp_rank;
      head.chain = GenesisChain(v.ledger_id, v.dp_rank);
      LOCKSTEP_RETURN_IF_ERROR(CreateLedgerHead(path, head));
    }
    LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<LedgerHeadWriter> head_writer,
                              LedgerHeadWriter::Open(path));
    // Verified: from here on the file is this writer's to write, checkpoint and clean up.
    LOCKSTEP_RETURN_IF_ERROR(opened.db->Exec("PRAGMA journal_mode=WAL"));
    LOCKSTEP_RETURN_IF_ERROR(opened.db->Exec(
        options.fsync_every_event ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL"));
    opened.db->SetCheckpointOnClose(true);
    std::unique_ptr<Ledger> ledger(new Ledger(path, options, fd, std::move(opened.db),
                                              std::move(v.ledger_id), std::move(v.chain),
                                              v.next_seq, std::move(head_writer)));
    for (const StepReplay& step : v.replay.steps) {
      if (step.step >= ledger->last_begun_step_) {
        ledger->last_begun_step_ = step.step;
        ledger->last_begun_committed_ = step.committed;
      }
    }
    return ledger;
  }();
  if (!ledger.ok()) close(fd);
  return ledger;
}

absl::StatusOr<LedgerReplay> Ledger::Replay(const std::string& path) {
  if (absl::Status exists = CheckLedgerPath(path); absl::IsNotFound(exists)) {
    LOCKSTEP_RETURN_IF_ERROR(CheckNoLostHistory(path));
    return exists;
  }
  LOCKSTEP_ASSIGN_OR_RETURN(Opened opened, OpenVerified(path));
  return std::move(opened.verified.replay);
}

}  // namespace admission
}  // namespace lockstep
