// admission/ledger.h
//
// The recovery ledger: a crash-safe record, in one SQLite file per DP rank, of every attempt the
// rank made at the microbatches of a training step (planned, admitted, started, completed,
// failed, split, retried, step committed), with the token ranges each attempt covered. Its
// purpose is exactly-once gradient contributions: every token of a step's plan contributes to the
// accumulated gradient once — never lost, never doubled — and after a crash, Replay answers which
// work of the current step has completed and whether the step committed.
//
// Contract:
// - Exactly-once is enforced by the schema at write time (a completed token range that overlaps
//   one already completed in the step, lies outside the step's plan, or arrives after the step
//   committed is refused by a trigger, and nothing of that event is written) and checked again on
//   replay. CommitStep refuses, naming the first missing range, a step whose planned tokens have
//   not all completed.
// - Durability: WAL mode. Every Record is its own transaction; with the default options it is
//   not fsynced (it survives the process being killed, since the WAL is in the OS page cache, but
//   an OS crash or power loss may lose events after the last fsync). CommitStep runs one
//   transaction and, with `fsync_at_commit` (default on), fsyncs the WAL before returning, so a
//   committed step and every event before it survive power loss; with CommitSync::kInBackground
//   it returns once the commit is written (it then survives the process being killed) and a
//   background thread fsyncs the WAL, which every later direct call and the destructor wait for
//   (queued calls are written after it).
//   `fsync_every_event` fsyncs every transaction.
// - Note [Queued ledger writes]: queued writes (QueueBeginStep, QueueRecord, QueueCommitStep)
//   return once checked and queued;
//   the ledger's writer thread writes them one at a time in call order, each exactly as its
//   direct form would. The file is always an intact prefix of the calls made: a crash loses the
//   queued writes not yet written, never part of one, and nothing after a failed queued write is
//   written (its error is then every later call's). Destroying the ledger writes what is queued;
//   a failure only seen then is logged, so callers that must know call AwaitDurable first.
// - Integrity: every event row carries a SHA-256 chain over its fields and the previous row's
//   chain, starting from a value bound to the ledger's identity (a random id made at creation and
//   its DP rank), so events of another ledger or rank never verify in it. Opening (writer or
//   replay) checks the file is a lockstep ledger of this schema version (PRAGMA application_id,
//   user_version) whose tables and triggers are exactly this build's, runs PRAGMA
//   integrity_check, verifies the chain and that the derived tables are exactly what the events
//   imply, and checks the database against the ledger's head record (`<path>-head`, Note [The
//   ledger's head record] in internal/ledger_head.h): the same identity, and the last durable
//   commit it names present with its chain value. So a WAL left by another ledger, a damaged WAL
//   frame or a missing WAL is found; nothing is checkpointed or removed before the file is
//   verified, and a refused file is left as found. Any failure is kDataLoss naming the path and
//   what is wrong: a corrupt, truncated, edited, foreign or shortened ledger is never silently
//   used. A path that is not a regular file (a directory, a link loop) is kInvalidArgument.
// - One writer per ledger: OpenWriter holds an exclusive flock on the file for the writer's life;
//   a second writer (any process, or the same one) gets kFailedPrecondition. Replay may run while
//   a writer is open.
// - Failure atomicity: an operation that returns an error has written nothing. Creating a ledger
//   publishes a complete empty one or nothing (a full disk included).
//
// Schema (version 1; inspect with `sqlite3 ledger.db`):
//   events(seq INTEGER PRIMARY KEY,    -- 1, 2, ... in recording order
//          step INTEGER, dp_rank INTEGER,
//          kind TEXT,                  -- planned|admitted|started|completed|failed|split|
//                                      -- retried|step_committed
//          microbatch TEXT,            -- stable id: "3" (plan index), "3.1" (second half of 3)
//          ranges TEXT,                -- "batch_index:begin-end;..." (input-sequence tokens)
//          detail TEXT,                -- free text (error message, wave, attempt)
//          chain BLOB)                 -- SHA-256 over the previous chain and this row
//   planned(step, dp_rank, batch_index, num_tokens)            -- a step's sequences
//   contributions(step, dp_rank, batch_index, token_begin, token_end, event_seq)
//                                                              -- completed ranges, no overlap
//   commits(step, dp_rank, event_seq)                          -- committed steps
//   e.g. `SELECT kind, microbatch, ranges, detail FROM events WHERE step = 7;`
//
// Thread-safety: a Ledger is used by one thread at a time (its own writer thread aside).
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Ledger> ledger,
//                             Ledger::OpenWriter("ledger.rank3.db", LedgerOptions::Of(3)));
//   LOCKSTEP_RETURN_IF_ERROR(ledger->BeginStep(step, PlannedWorkOf(plan)));
//   // For each attempt at microbatch "0" (ranges: its tokens), kStarted, then kCompleted:
//   LOCKSTEP_RETURN_IF_ERROR(
//       ledger->Record(LedgerEvent::Of(LedgerEventKind::kStarted, step, "0", ranges)).status());
//   LOCKSTEP_RETURN_IF_ERROR(
//       ledger->Record(LedgerEvent::Of(LedgerEventKind::kCompleted, step, "0", ranges)).status());
//   LOCKSTEP_RETURN_IF_ERROR(ledger->CommitStep(step));
//   // After a crash:
//   LOCKSTEP_ASSIGN_OR_RETURN(LedgerReplay replay, Ledger::Replay("ledger.rank3.db"));

#ifndef LOCKSTEP_ADMISSION_LEDGER_H_
#define LOCKSTEP_ADMISSION_LEDGER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lockstep {
namespace admission {

namespace internal {
class LedgerHeadWriter;
class SerialWriter;
class SqliteDb;
}  // namespace internal

// What an event records (the schema's kind column; see the top of this file).
enum class LedgerEventKind {
  kPlanned,        // a microbatch of the step's plan (written by BeginStep, one per microbatch)
  kAdmitted,       // an attempt admitted under the memory cap (detail: prediction and cap)
  kStarted,        // an attempt started
  kCompleted,      // an attempt completed: its ranges are the step's contribution, once
  kFailed,         // an attempt failed (detail: the error; "out of memory: ..." when it was)
  kSplit,          // work split after running out of memory (detail: into which halves)
  kRetried,        // an attempt that follows a failed one (of the same or split-off work)
  kStepCommitted,  // the step committed: every planned token completed (written by CommitStep)
};

// "planned", "admitted", ..., "step_committed" (the schema's kind column).
absl::string_view LedgerEventKindName(LedgerEventKind kind);

// Tokens [begin, end) of input sequence `batch_index` of the step's batch.
struct TokenRange {
  int32_t batch_index = 0;  // index of the input sequence in the step's batch (>= 0)
  int64_t begin = 0;        // first token, 0-based in the sequence
  int64_t end = 0;          // one past the last token; begin < end

  // Whether both are the same range of the same sequence.
  friend bool operator==(const TokenRange& a, const TokenRange& b) {
    return a.batch_index == b.batch_index && a.begin == b.begin && a.end == b.end;
  }
};

// "batch_index:begin-end;..." as stored in the ranges column.
std::string FormatTokenRanges(const std::vector<TokenRange>& ranges);

// A microbatch of a step's plan: its stable id and the token ranges it holds.
struct PlannedMicrobatch {
  // The microbatch `id` holding `ranges`.
  static PlannedMicrobatch Of(std::string id, std::vector<TokenRange> ranges) {
    PlannedMicrobatch microbatch;
    microbatch.id = std::move(id);
    microbatch.ranges = std::move(ranges);
    return microbatch;
  }
  // Its id, unique in the step and non-empty: "3" (plan index), "3.1" (second half of 3).
  std::string id;
  // The tokens it holds, as ranges of the batch's input sequences.
  std::vector<TokenRange> ranges;
};

// One event: what happened to which microbatch of which step.
struct LedgerEvent {
  // An event of `kind` for `microbatch` of step `step`, covering `ranges`, with `detail`.
  static LedgerEvent Of(LedgerEventKind kind, int64_t step, std::string microbatch,
                        std::vector<TokenRange> ranges, std::string detail = "") {
    LedgerEvent event;
    event.kind = kind;
    event.step = step;
    event.microbatch = std::move(microbatch);
    event.ranges = std::move(ranges);
    event.detail = std::move(detail);
    return event;
  }
  // What happened.
  LedgerEventKind kind = LedgerEventKind::kPlanned;
  // The training step it happened in (>= 0).
  int64_t step = 0;
  // Filled by the ledger from its options when recording; read back by Replay.
  int dp_rank = 0;
  // The id of the microbatch (PlannedMicrobatch::id), or of a wave's microbatches joined by "+"
  // ("3+4"); empty for kStepCommitted.
  std::string microbatch;
  // The tokens the event is about (empty for kStepCommitted).
  std::vector<TokenRange> ranges;
  // Free text for people: an error message, a prediction, a split.
  std::string detail;
  // Position in the ledger (1, 2, ...); set by the ledger.
  int64_t seq = 0;
};

// How a ledger writer records: its DP rank and when it fsyncs.
struct LedgerOptions {
  // Options for the ledger of DP rank `dp_rank` (>= 0).
  static LedgerOptions Of(int dp_rank) {
    LedgerOptions options;
    options.dp_rank = dp_rank;
    return options;
  }
  // The DP rank whose ledger this is (>= 0): recorded in every event and bound into the chain.
  int dp_rank = 0;
  // fsync the WAL when a step commits (SQLite synchronous=FULL for that transaction).
  bool fsync_at_commit = true;
  // fsync every transaction (synchronous=FULL throughout); slower, loses nothing on power loss.
  bool fsync_every_event = false;
};

// What the ledger says about one step of one DP rank.
struct StepReplay {
  int64_t step = 0;              // the training step
  int dp_rank = 0;               // the DP rank that recorded it
  bool committed = false;        // whether the step committed
  int64_t planned_tokens = 0;    // tokens of the step's plan
  int64_t completed_tokens = 0;  // tokens of the plan completed (each counted once)
  // Completed ranges, sorted by (batch_index, begin), adjacent ranges merged.
  std::vector<TokenRange> completed;
  // Planned ranges not completed, in the same order (empty for a committed step).
  std::vector<TokenRange> missing;
  // Ids of the microbatches whose completion was recorded, in recording order.
  std::vector<std::string> completed_microbatches;
  // Events of the step, by kind (indexed by LedgerEventKind).
  std::vector<int64_t> event_counts;
};

// A verified ledger's contents.
struct LedgerReplay {
  // Steps in the order they began.
  std::vector<StepReplay> steps;
  // Every event in recording order.
  std::vector<LedgerEvent> events;

  // The step `step` of DP rank `dp_rank`, or nullptr if it never began.
  const StepReplay* Find(int64_t step, int dp_rank) const;
  // The last committed step of `dp_rank`, or -1.
  int64_t LastCommittedStep(int dp_rank) const;
  // A few lines for people: per step, committed or not, tokens completed of planned, events by
  // kind, missing ranges.
  std::string Summary() const;
};

// Removes the ledger at `path` and its WAL and shared-memory files, where they exist (best
// effort: a ledger that must not be left behind is checked with Replay's kNotFound).
void RemoveLedgerFiles(const std::string& path);

// A DP rank's recovery ledger, open for writing (see the top of this file).
class Ledger {
 public:
  // Opens (creating if absent or empty) the ledger at `path` as its one writer, after the
  // integrity checks above. kInvalidArgument for a negative dp_rank; kFailedPrecondition if
  // another writer holds it; kDataLoss for a file that is not an intact ledger (it is left as it
  // is); other codes for I/O errors, naming the path.
  static absl::StatusOr<std::unique_ptr<Ledger>> OpenWriter(const std::string& path,
                                                            const LedgerOptions& options);

  // Reads and verifies the ledger at `path` without writing to it (other than SQLite's recovery
  // of a crashed writer's WAL). kNotFound for a missing file; kDataLoss as OpenWriter.
  static absl::StatusOr<LedgerReplay> Replay(const std::string& path);

  ~Ledger();
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  // Records step `step`'s plan (one "planned" event per microbatch) in one transaction. The
  // microbatches' ranges must tile each sequence they name from token 0 without gap or overlap;
  // ids must be unique and non-empty. kInvalidArgument, naming the offending id or range, for
  // malformed work or a negative step; kFailedPrecondition for a step already begun (continue it
  // with Record after a Replay), or not after the last committed step.
  absl::Status BeginStep(int64_t step, const std::vector<PlannedMicrobatch>& microbatches);

  // Records one event of a begun, uncommitted step (kind other than kPlanned and
  // kStepCommitted). A kCompleted event's ranges become the step's contributions:
  // kFailedPrecondition, naming the range, if one overlaps a completed range or lies outside the
  // plan. Returns the event's seq.
  absl::StatusOr<int64_t> Record(const LedgerEvent& event);

  // When CommitStep's fsync (LedgerOptions::fsync_at_commit) happens.
  enum class CommitSync {
    // Before CommitStep returns: a committed step survives power loss once CommitStep is OK.
    kBeforeReturn,
    // On a background thread: CommitStep returns once the commit is written to the WAL (it
    // survives the process being killed, not yet power loss), so the fsync (admission_benchmark
    // measures it) overlaps the caller's work. It is durable once AwaitDurable returns OK; every
    // later BeginStep, Record and CommitStep, and the destructor, wait for it first, and a
    // failed fsync is their error.
    kInBackground,
  };

  // Commits step `step`: kFailedPrecondition naming the first missing range if not every planned
  // token has completed, or if the step is not begun or already committed. Durable per options
  // and `sync`.
  absl::Status CommitStep(int64_t step, absl::string_view detail = "",
                          CommitSync sync = CommitSync::kBeforeReturn);

  // Queued forms of BeginStep, Record and CommitStep, for callers that must not wait for the
  // file (a training step's critical path). Each first checks what needs no file: the plan (as
  // BeginStep), the kind (as Record), and from the ledger's own account of the calls made so far
  // (queued ones included) that the step may begin, or is begun and not committed; such a
  // refusal is returned at once and queues nothing. Otherwise the call is queued and returns.
  // The writer thread then writes it as the direct form would (QueueCommitStep fsyncs before the
  // next queued write begins, per LedgerOptions). A queued write refused when written (an
  // exactly-once trigger: a range counted twice or outside the plan, a commit whose planned tokens
  // did not all complete) or failing (I/O) writes nothing, no queued write after it is written,
  // and its error becomes this ledger's error: every later call, AwaitDurable included, returns
  // it. Replay sees a queued write once AwaitDurable has returned. At most kMaxQueuedWrites wait
  // to be written; a call beyond that waits for the writer first.
  static constexpr int kMaxQueuedWrites = 1024;
  // BeginStep, queued: checked now, written by the writer thread (see above).
  absl::Status QueueBeginStep(int64_t step, std::vector<PlannedMicrobatch> microbatches);
  // Record, queued; the event's seq is not returned.
  absl::Status QueueRecord(LedgerEvent event);
  // CommitStep, queued; its fsync (per LedgerOptions) runs on the writer thread.
  absl::Status QueueCommitStep(int64_t step, std::string detail = "");

  // Waits until every queued write is written and a background fsync of CommitSync::kInBackground
  // or QueueCommitStep is done: OK once every committed step is durable. A failed fsync is
  // kInternal naming the WAL and the error; it, like a failed queued write, stays this ledger's
  // error for every later call (Linux does not promise that a retried fsync covers the data of
  // the failed one).
  absl::Status AwaitDurable();

  // The last step this ledger's rank began (-1 if none), counting queued BeginSteps.
  int64_t last_begun_step() const { return last_begun_step_; }

  // The ledger's file, as given to OpenWriter.
  const std::string& path() const { return path_; }
  // The options it was opened with.
  const LedgerOptions& options() const { return options_; }

 private:
  Ledger(std::string path, LedgerOptions options, int lock_fd,
         std::unique_ptr<internal::SqliteDb> db, std::string ledger_id, std::string chain,
         int64_t next_seq, std::unique_ptr<internal::LedgerHeadWriter> head);
  absl::StatusOr<int64_t> Append(const LedgerEvent& event);
  // The file-free checks of BeginStep: the planned tokens per sequence, or the refusal.
  absl::StatusOr<std::map<int32_t, int64_t>> CheckPlan(
      int64_t step, const std::vector<PlannedMicrobatch>& microbatches) const;
  // Whether step `step` may begin, after the calls made so far (last_begun_step_).
  absl::Status CheckMayBegin(int64_t step) const;
  // The writes themselves, on whichever thread runs them; failure atomic.
  absl::Status WriteBegin(int64_t step, const std::map<int32_t, int64_t>& tokens,
                          const std::vector<PlannedMicrobatch>& microbatches);
  absl::StatusOr<int64_t> WriteRecord(const LedgerEvent& event);
  absl::Status WriteCommit(int64_t step, absl::string_view detail, bool fsync_now);
  // Runs `body` in one transaction; on failure the chain and the next seq go back to what they
  // were (nothing of it was written).
  absl::Status InChainTransaction(const std::function<absl::Status()>& body);
  // "ledger <path>, step <step>": where a refusal of a call on `step` happened.
  std::string StepWhere(int64_t step) const;
  // Whether `step` is the open one, by the account of the calls made so far.
  bool IsOpen(int64_t step) const { return step == last_begun_step_ && !last_begun_committed_; }
  // The refusal of a direct call on `step`, which is not the open one: `where`, then
  // `committed_text` if the file holds the step committed, or that it never began.
  absl::Status ClosedStepRefusal(int64_t step, absl::string_view where,
                                 absl::string_view committed_text) const;
  // Whether a commit is fsynced on its own (not when every event already is).
  bool FsyncsAtCommit() const { return options_.fsync_at_commit && !options_.fsync_every_event; }
  // Fsyncs the WAL (and once its directory).
  absl::Status SyncWal();
  // Note [The ledger's head record]: moves the head to the commit event `seq` with chain value
  // `chain`, once that commit is durable. A failure leaves the head behind (allowed: it may lag),
  // and is logged, not returned: the commit itself stands.
  void AdvanceHead(int64_t seq, const std::string& chain);
  // The sticky error of a failed queued write or background fsync (OK if none), without waiting.
  absl::Status QueuedError();
  // Queues `write` for the writer thread; the sticky error if there is one.
  absl::Status Enqueue(std::function<absl::Status()> write);

  std::string path_;
  LedgerOptions options_;
  int lock_fd_;
  std::unique_ptr<internal::SqliteDb> db_;
  std::string ledger_id_;
  std::unique_ptr<internal::LedgerHeadWriter> head_;
  // Chain value of the last event, and the seq the next event gets (the writing thread's).
  std::string chain_;
  int64_t next_seq_;
  // The caller's account of its calls (queued ones included): the last step begun by this rank
  // and whether it committed.
  int64_t last_begun_step_ = -1;
  bool last_begun_committed_ = true;
  bool wal_dir_synced_ = false;  // the WAL's directory entry made durable (by SyncWal)
  // Queued writes and background fsyncs, in order, on one thread; a failed one's error is sticky
  // and drops every write after it.
  std::unique_ptr<internal::SerialWriter> writer_;
};

}  // namespace admission
}  // namespace lockstep

#endif  // LOCKSTEP_ADMISSION_LEDGER_H_
